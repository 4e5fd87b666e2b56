"""One request's total work is bounded before it reaches the engine, and heavy requests never stall the
other streams: regression tests through a live ``sarathi serve``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx

from tests.server.conftest import post_body

PROMPT_IDS = [(i * 7919) % 40000 + 100 for i in range(4000)]


def _refused(r: httpx.Response, param: str, *numbers: int) -> dict:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param
    for number in numbers:
        assert str(number) in error["message"], error["message"]
    return error


class HealthProbe:
    """Times GET /health back to back while the ``with`` block runs; ``worst`` is the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url, self.times = url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            httpx.get(f"{self.url}/health", timeout=60)
            self.times.append(time.monotonic() - start)
            time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def worst(self) -> float:
        return max(self.times)


def _kv_pool_tokens(server) -> int:
    config = server.config()
    return config["num_kv_blocks"] * config["block_size"]


def test_a_request_that_needs_more_kv_than_the_pool_is_refused(server):
    """Issue: n=64 x (4000-token prompt + 4000 max_tokens) was accepted; it needed more KV than the whole
    pool, gave no first chunk in 120 s and stalled another stream 16 s."""
    url, pool = f"{server.url}/v1/completions", _kv_pool_tokens(server)
    r = post_body(url, {"prompt": PROMPT_IDS, "n": 16, "max_tokens": 4000})
    _refused(r, "n", 16 * 8000, pool)
    r = post_body(url, {"prompt": PROMPT_IDS, "n": 2, "best_of": 16, "max_tokens": 4000})
    _refused(r, "best_of", 16 * 8000, pool)
    # A batch counts all of its prompts' sequences: 10 x (4000 + 16) tokens here.
    r = post_body(url, {"prompt": [PROMPT_IDS] * 10})
    _refused(r, "prompt", 10 * 4016, pool)


def test_per_request_caps_on_n_batch_prompts_and_detokenize(server):
    """Issue: nothing bounded n below 64, a batch's prompt count below 256 sequences, or /detokenize (2 M ids
    blocked /health 1.4 s). Each cap is a flag; the refusal names the param and the flag."""
    limits = server.config()["limits"]
    assert (limits["max_n"], limits["max_batch_prompts"]) == (16, 64)
    url = f"{server.url}/v1/completions"
    error = _refused(post_body(url, {"prompt": "hi", "max_tokens": 1, "n": 17}), "n", 17, 16)
    assert "--max-n" in error["message"]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "n": 17}
    _refused(post_body(f"{server.url}/v1/chat/completions", chat), "n", 17)
    error = _refused(post_body(url, {"prompt": ["hi"] * 65, "max_tokens": 1}), "prompt", 65, 64)
    assert "--max-batch-prompts" in error["message"]
    max_model_len = server.config()["max_model_len"]
    detok = f"{server.url}/detokenize"
    error = _refused(post_body(detok, {"tokens": [42] * (max_model_len + 1)}), "tokens", max_model_len)
    assert "--max-detokenize-tokens" in error["message"]
    assert post_body(detok, {"tokens": [42] * max_model_len}).status_code == 200

    # 2 M ids: refused before validation, while /health keeps answering.
    body = b'{"tokens": [' + b",".join([b"12345"] * 2_000_000) + b"]}"
    with HealthProbe(server.url) as health:
        _refused(post_body(detok, body), "tokens", 2_000_000)
    assert health.worst < 1.0, health.worst


def test_work_cap_flags_are_checked_at_startup():
    for flag in ("--max-n", "--max-batch-prompts", "--max-detokenize-tokens"):
        done = subprocess.run(
            [sys.executable, "-m", "sarathi", "serve", flag, "0"], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and f"{flag} must be >= 1" in done.stderr, done.stderr


VICTIM_TOKENS = 1000


class Victim:
    """A stream running beside a heavy request: the gaps between its tokens, until ``stop()`` (which
    closes it, aborting the rest) or its end."""

    def __init__(self, url: str) -> None:
        self.url, self.gaps = url, []
        self._started, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        assert self._started.wait(120)

    def _run(self) -> None:
        body = {"prompt": "Count:", "max_tokens": VICTIM_TOKENS, "ignore_eos": True, "stream": True}
        last = None
        with httpx.stream("POST", self.url, json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.monotonic()
                if last is not None:
                    self.gaps.append(now - last)
                last = now
                self._started.set()
                if self._stop.is_set():
                    return

    @property
    def tokens(self) -> int:
        return len(self.gaps)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(600)
        assert self.tokens < VICTIM_TOKENS - 1  # it was still running when the heavy request finished


def _iterations(server) -> float:
    return server.metrics()["sarathi_iteration_time_seconds_count"]


def test_n16_children_do_not_stall_a_running_stream(server):
    """With sarathi's scheduler, a request's 16 children share each iteration's token budget with the
    running stream: it gets a token in every iteration while they run, never waits out their prefills.
    (Counted in iterations, not seconds: on a shared 2-core machine one iteration's wall time varies.)"""
    url = f"{server.url}/v1/completions"
    victim = Victim(url)
    tokens_before, iterations_before = victim.tokens, _iterations(server)
    children = {"prompt": PROMPT_IDS[:200], "n": 16, "max_tokens": 8, "ignore_eos": True}
    r = httpx.post(url, json=children, timeout=600)
    tokens, iterations = victim.tokens - tokens_before, _iterations(server) - iterations_before
    victim.stop()
    assert r.status_code == 200 and len(r.json()["choices"]) == 16
    assert iterations >= 8 and tokens >= iterations - 3, (tokens, iterations, victim.gaps)


def test_prompt_logprobs_of_a_long_prompt_stall_nobody(server):
    """Issue: echo + logprobs 20 (and prompt_logprobs 20) on a 4,000-token prompt took minutes, stalled
    another stream and held /health up to 2.3 s: the 4,000 x 21 scored entries were shaped into text on
    the event loop (one tokenizer call per entry, text offsets summed in O(n^2)). Now a ~2,000-token prompt
    is scored chunk by chunk beside a running stream, which gets a token in every iteration, and /health
    answers within a second throughout."""
    url = f"{server.url}/v1/completions"
    victim = Victim(url)
    try:
        tokens_before, iterations_before = victim.tokens, _iterations(server)
        scored = {"echo": True, "logprobs": 20, "prompt_logprobs": 20}
        body = {"prompt": PROMPT_IDS[:2000], "max_tokens": 1, **scored}
        start = time.monotonic()
        with HealthProbe(server.url) as health:
            r = httpx.post(url, json=body, timeout=600)
        elapsed = time.monotonic() - start
        tokens, iterations = victim.tokens - tokens_before, _iterations(server) - iterations_before
    finally:
        victim.stop()
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert len(choice["prompt_logprobs"]) == 2000 and choice["prompt_logprobs"][0] is None
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == 2001 and lp["token_logprobs"][0] is None
    assert lp["text_offset"][1:] == [sum(map(len, lp["tokens"][:i])) for i in range(1, 2001)]
    assert elapsed < 300
    assert iterations >= 4 and tokens >= iterations - 3, (tokens, iterations)
    assert health.worst < 1.0, health.worst
