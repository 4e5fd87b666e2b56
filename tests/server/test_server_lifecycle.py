"""Abort on disconnect, queue overload, engine-core death and graceful shutdown of a live server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from sarathi import LLM, SamplingParams
from tests.server.conftest import ServerProcess, check_sigterm_finishes_in_flight_requests, wait_for

LONG = {"prompt": "Tell me a very long story.", "max_tokens": 900, "ignore_eos": True, "temperature": 0}


def test_closing_a_stream_aborts_the_request_and_frees_its_blocks(server):
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**LONG, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        received = [line for line, _ in zip(lines, range(10), strict=False) if line.startswith("data: ")]
        assert received
        m = server.metrics()
        assert m["sarathi_num_requests_running"] == 1 and m["sarathi_kv_cache_blocks_used"] > 0
    closed = time.monotonic()

    def freed() -> bool:
        m = server.metrics()
        return m["sarathi_num_requests_running"] == 0 and m["sarathi_kv_cache_blocks_used"] == 0

    assert wait_for(freed, 1.0), server.metrics()
    assert time.monotonic() - closed < 1.5
    assert server.metrics()['sarathi_requests_total{finish_reason="abort"}'] >= 1


@pytest.fixture(scope="module")
def one_seq_server():
    """A vllm-scheduler server that runs one request at a time, lets one more wait, and has a 1024-token
    KV cache."""
    srv = ServerProcess(
        "--scheduler", "vllm", "--num-kv-blocks", "64", "--max-num-seqs", "1", "--max-waiting", "1"
    )
    yield srv
    srv.stop()


def test_greedy_outputs_equal_offline_generate_under_vllm_scheduler(one_seq_server):
    """The server runs one request at a time, so offline generates each prompt alone too: with the same
    batches the outputs must be equal token for token (a quantized layer takes the int8 or the bf16 path by
    the batch's row count, so other batches may flip a near-tie; tests/engine/test_output_invariance.py
    checks that rule)."""
    prompts = ["The best way to learn", "In 1492,", "def add(a, b):"]
    llm = LLM(num_kv_blocks=128)
    params = SamplingParams(temperature=0.0, max_tokens=20)
    offline = [llm.generate([prompt], params)[0] for prompt in prompts]
    for prompt, out in zip(prompts, offline, strict=True):
        body = {"prompt": prompt, "max_tokens": 20, "temperature": 0}
        r = httpx.post(f"{one_seq_server.url}/v1/completions", json=body, timeout=120)
        assert r.json()["choices"][0]["text"] == out.text


def test_full_waiting_queue_gets_429_with_retry_after(one_seq_server):
    url = f"{one_seq_server.url}/v1/completions"
    with httpx.Client(timeout=120) as c, c.stream("POST", url, json={**LONG, "stream": True}) as running:
        lines = running.iter_lines()  # keep a reference: closing the iterator closes the response
        next(lines)  # running now
        waiting = threading.Thread(
            target=lambda: httpx.post(url, json={**LONG, "max_tokens": 5}, timeout=300)
        )
        waiting.start()
        assert wait_for(lambda: one_seq_server.metrics()["sarathi_num_requests_waiting"] == 1, 10)
        r = httpx.post(url, json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
    waiting.join(300)
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200


def test_the_context_is_capped_to_the_kv_cache(one_seq_server):
    """A 1024-token KV cache under the model's 8192-token context: the served context is 1024, so chat
    without max_tokens works (it used to be refused, blaming the prompt) and a request too large for the
    cache is a 400 naming the context."""
    srv = one_seq_server
    assert httpx.get(f"{srv.url}/v1/models").json()["data"][0]["max_model_len"] == 1024
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "temperature": 0}
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, timeout=300)
    assert r.status_code == 200, r.text
    url = f"{srv.url}/v1/completions"
    r = httpx.post(url, json={"prompt": [7] * 1000, "max_tokens": 100}, timeout=60)
    assert r.status_code == 400 and "maximum context length is 1024" in r.json()["error"]["message"]
    assert httpx.post(url, json={"prompt": [7] * 100, "max_tokens": 2}, timeout=120).status_code == 200


def test_a_max_model_len_the_kv_cache_cannot_hold_is_refused_at_startup():
    with pytest.raises(RuntimeError) as e:
        ServerProcess("--num-kv-blocks", "64", "--max-model-len", "8192")
    message = str(e.value)
    assert "max_model_len 8192 does not fit the KV cache, which holds 1024 tokens" in message
    assert "--num-kv-blocks" in message


def test_a_port_in_use_is_refused_before_the_model_loads():
    """The server binds its port before it starts the engine core and workers (whose own sockets could
    otherwise take a port picked free): a taken port fails at once, naming it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "sarathi", "serve", "--host", "127.0.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "loading" not in done.stdout


def test_engine_core_death_fails_health_and_in_flight_requests(one_seq_server):
    srv = one_seq_server
    url = f"{srv.url}/v1/completions"
    errors = []
    with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=120) as r:
        lines = r.iter_lines()
        next(lines)
        os.kill(srv.engine_core_pid, signal.SIGKILL)
        killed = time.monotonic()
        for line in lines:
            if line.startswith("data: {"):
                payload = json.loads(line.removeprefix("data: "))
                if "error" in payload:
                    errors.append(payload["error"])
    assert time.monotonic() - killed < 5
    assert errors and errors[0]["code"] == "engine_dead"
    assert wait_for(lambda: httpx.get(f"{srv.url}/health").status_code == 503, 2)
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 2}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"


def test_sigterm_finishes_in_flight_requests_and_stops_everything():
    srv = ServerProcess("--num-kv-blocks", "512", "--shutdown-timeout", "60")
    try:
        check_sigterm_finishes_in_flight_requests(srv)
    finally:
        srv.stop()
