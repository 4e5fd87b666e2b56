"""``sarathi serve --pipeline-parallel-size 2``: two worker processes behind the engine core pass the
server test set (openai client, streaming, abort on disconnect, bad input, worker death, SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import httpx
import openai
import pytest

from sarathi import LLM, SamplingParams
from tests.server.conftest import (
    ServerProcess,
    check_sigterm_finishes_in_flight_requests,
    pid_alive,
    post_body,
    wait_for,
)
from tests.server.test_bad_input import CASES

PROMPTS = ["The best way to learn", "In 1492,", "def add(a, b):", "Write a haiku about rain."]
LONG = {"prompt": "Tell me a very long story.", "max_tokens": 900, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def pp_server():
    srv = ServerProcess("--pipeline-parallel-size", "2", "--num-kv-blocks", "1024")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def offline() -> list[str]:
    """Each prompt generated alone, as the server below receives them: the same batches, so the same tokens
    (a quantized layer's path depends on the batch's row count; near-ties across batches are
    tests/engine/test_output_invariance.py's)."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    with LLM(num_kv_blocks=128) as llm:
        return [llm.generate([prompt], params)[0].text for prompt in PROMPTS]


def test_two_workers_run_the_model(pp_server):
    assert len(pp_server.worker_pids) == 2 and all(pid_alive(p) for p in pp_server.worker_pids)


def test_greedy_outputs_equal_the_single_process_engine(pp_server, offline):
    client = openai.OpenAI(base_url=f"{pp_server.url}/v1", api_key="x", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    for prompt, expected in zip(PROMPTS, offline, strict=True):
        kw = dict(model=model, prompt=prompt, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
        assert client.completions.create(**kw).choices[0].text == expected
        chunks = list(client.completions.create(**kw, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected


def test_concurrent_chat_streams(pp_server):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None]:
        stream = await client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": f"Count from {i} to {i + 10}."}],
            max_tokens=12 + i,
            temperature=0,
            stream=True,
        )
        text, finish = [], None
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return "".join(text), finish

    async def main():
        async with openai.AsyncOpenAI(base_url=f"{pp_server.url}/v1", api_key="x", max_retries=0) as c:
            return await asyncio.gather(*(one(c, i) for i in range(8)))

    for text, finish in asyncio.run(main()):
        assert text and finish in ("stop", "length")


def test_closing_a_stream_aborts_and_frees_blocks(pp_server):
    with httpx.stream(
        "POST", f"{pp_server.url}/v1/completions", json={**LONG, "stream": True}, timeout=120
    ) as r:
        lines = r.iter_lines()
        assert [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data: ")]

    def freed() -> bool:
        m = pp_server.metrics()
        return m["sarathi_num_requests_running"] == 0 and m["sarathi_kv_cache_blocks_used"] == 0

    assert wait_for(freed, 3.0), pp_server.metrics()


@pytest.mark.parametrize(("endpoint", "body", "status", "param"), CASES[::3])
def test_bad_input_gets_openai_error(pp_server, endpoint, body, status, param):
    r = post_body(f"{pp_server.url}/v1/{endpoint}", body)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_killed_worker_fails_health_and_open_streams_and_leaves_no_process():
    srv = ServerProcess("--pipeline-parallel-size", "2", "--num-kv-blocks", "256")
    try:
        errors = []
        url = f"{srv.url}/v1/completions"
        with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=120) as r:
            lines = r.iter_lines()
            next(lines)
            os.kill(srv.worker_pids[1], signal.SIGKILL)
            killed = time.monotonic()
            for line in lines:
                if line.startswith("data: {"):
                    payload = json.loads(line.removeprefix("data: "))
                    if "error" in payload:
                        errors.append(payload["error"])
        assert time.monotonic() - killed < 10
        assert errors and errors[0]["code"] == "engine_dead" and "rank 1" in errors[0]["message"]
        assert wait_for(lambda: httpx.get(f"{srv.url}/health").status_code == 503, 5)
        r = httpx.post(url, json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        # The engine core stops its other worker and exits; nothing is left behind.
        assert wait_for(lambda: not any(pid_alive(p) for p in [srv.engine_core_pid, *srv.worker_pids]), 15)
    finally:
        srv.stop()


# Idle is `make test-all` only (~18 s a server): the streaming case kills the stage while it runs a request.
@pytest.mark.parametrize(
    "busy", [pytest.param(False, marks=pytest.mark.slow, id="idle"), pytest.param(True, id="streaming")]
)
def test_a_killed_first_stage_stops_the_other_worker_and_the_engine_core(busy):
    """SIGKILL pipeline stage 0: the survivor (stage 1) and the engine core exit within seconds, whether
    a stream was running or not, and the API answers 503 as after an engine-core crash."""
    srv = ServerProcess("--pipeline-parallel-size", "2", "--num-kv-blocks", "256")
    try:
        survivor = srv.worker_pids[1]
        with contextlib.ExitStack() as open_stream:
            if busy:
                body = {**LONG, "stream": True}
                r = open_stream.enter_context(
                    httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=120)
                )
                next(r.iter_lines())  # the first token: both stages are running the request
            os.kill(srv.worker_pids[0], signal.SIGKILL)
            assert wait_for(lambda: not pid_alive(srv.engine_core_pid) and not pid_alive(survivor), 15)
        r = httpx.get(f"{srv.url}/health", timeout=10)
        assert r.status_code == 503 and "rank 0" in r.json()["error"]["message"], r.text
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
    finally:
        srv.stop()


def test_sigterm_finishes_in_flight_requests_and_stops_every_worker():
    srv = ServerProcess("--pipeline-parallel-size", "2", "--num-kv-blocks", "256", "--shutdown-timeout", "60")
    try:
        check_sigterm_finishes_in_flight_requests(srv)
    finally:
        srv.stop()
