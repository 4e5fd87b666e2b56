"""Untrusted constraints (issue: hardening round 2) through a live server: a grammar that used to segfault
the API process, constraints over the server's bounds, constraints that admit no output and one that fails
mid-generation are each that request's 400 naming the field. Every other request goes on: the server still
answers the same greedy request identically, and a stream running beside a heavy constraint's compile keeps
flowing (the order-of-magnitude version of the stall budget; benchmarks/stall_budget.py measures it)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.server.conftest import ServerProcess


def chain_grammar(num_rules: int) -> str:
    """A chain of rules, each referring to the next: 5,000 of them overflowed llguidance's stack."""
    rules = "\n".join(f'r{i}: "t{i}" r{i + 1} | "u{i}"' for i in range(num_rules))
    return f'start: r0\n{rules}\nr{num_rules}: "end"\n'


def complete(url: str, extra: dict, prompt: str = "x", max_tokens: int = 8) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


GREEDY = {"prompt": "The capital of France is", "max_tokens": 8}
WIDE_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5000)}}
DEEP_SCHEMA = {"type": "array", "items": json.loads("[" * 40 + "]" * 40)}
MANY_RULES = "start: a0\n" + "".join(f'a{i}: "x"\n' for i in range(1500))


def test_the_grammar_that_segfaulted_the_server_is_a_400_and_the_server_lives(server):
    before = complete(server.url, {}, **GREEDY).json()["choices"][0]["text"]
    r = complete(server.url, {"guided_grammar": chain_grammar(5000)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "guided_grammar" and "--max-grammar-chars" in error["message"]
    assert server.proc.poll() is None
    assert complete(server.url, {}, **GREEDY).json()["choices"][0]["text"] == before


@pytest.mark.parametrize(
    ("extra", "param", "flag"),
    [
        ({"guided_choice": [str(i) for i in range(100_000)]}, "guided_choice", "--max-choices"),
        ({"guided_choice": ["a" * 5000]}, "guided_choice", "--max-choice-chars"),
        ({"guided_json": WIDE_SCHEMA}, "guided_json", "--max-schema-chars"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": DEEP_SCHEMA}}},
            "response_format.json_schema.schema",
            "--max-schema-depth",
        ),
        ({"guided_regex": "(" * 100 + "a" + ")" * 100}, "guided_regex", "--max-nesting"),
        ({"guided_regex": "a" * 5000}, "guided_regex", "--max-regex-chars"),
        ({"guided_grammar": MANY_RULES}, "guided_grammar", "--max-grammar-rules"),
    ],
)
def test_constraints_over_a_bound_are_400s_naming_the_field_and_the_flag(server, extra, param, flag):
    start = time.monotonic()
    r = complete(server.url, extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and flag in error["message"], error
    assert error["code"] == "invalid_structured_output"
    assert time.monotonic() - start < 10  # refused before any compile


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_json": {"$ref": "#"}}, "guided_json"),
        ({"guided_grammar": 'start: start "a"'}, "guided_grammar"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar"),
    ],
)
def test_constraints_that_admit_no_output_are_400s_without_library_internals(server, extra, param):
    r = complete(server.url, extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_structured_output"
    assert "<state>" not in error["message"] and "\n" not in error["message"]  # no parser dump


def test_a_constraint_that_fails_mid_generation_is_that_requests_400(server):
    # Compiles, and its first mask is fine, but llguidance's parser gives up a few tokens in (its rows
    # grow past 2,000 items with this many optional properties).
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}}
    r = complete(server.url, {"guided_json": schema}, max_tokens=16)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        error = r.json()["error"]
        assert error["code"] == "invalid_structured_output" and "<state>" not in error["message"]
    assert complete(server.url, {}, **GREEDY).status_code == 200


def test_a_heavy_constraint_compiles_without_stalling_other_streams_or_health(server):
    """A schema near the bounds compiles (in the checker's helper, then on the worker's build thread)
    while another stream decodes: no gap in that stream, and no /health answer, takes seconds."""
    gaps, health = [], []
    stop = threading.Event()

    def stream():
        body = {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True, "temperature": 0}
        last = None
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                now = time.monotonic()
                if line.startswith("data: ") and last is not None:
                    gaps.append(now - last)
                last = now
                if stop.is_set():
                    break

    def probe_health():
        while not stop.is_set():
            start = time.monotonic()
            httpx.get(f"{server.url}/health", timeout=30)
            health.append(time.monotonic() - start)
            time.sleep(0.05)

    threads = [threading.Thread(target=stream), threading.Thread(target=probe_health)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the stream is decoding
    choices = [f"choice number {i} of a long list" for i in range(1000)]
    schema = {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string", "enum": ["x", "y"]} for i in range(400)},
        "required": ["field_0"],
    }
    for extra in ({"guided_choice": choices}, {"guided_json": schema}):
        r = complete(server.url, extra, max_tokens=4)
        assert r.status_code == 200, r.text
    stop.set()
    for t in threads:
        t.join(120)
    assert gaps and health
    assert max(gaps) < 2.0, f"worst gap {max(gaps):.2f} s"
    assert max(health) < 2.0, f"worst /health {max(health):.2f} s"


@pytest.fixture(scope="module")
def lenient_server():
    """Bounds raised far past the defaults, and a short compile timeout."""
    srv = ServerProcess(
        "--num-kv-blocks",
        "512",
        "--dtype",
        "float32",
        "--max-grammar-chars",
        "10000000",
        "--max-grammar-rules",
        "1000000",
        "--max-choices",
        "1000000",
        "--structured-output-compile-timeout",
        "2",
    )
    yield srv
    srv.stop()


def test_past_the_bounds_a_deep_grammar_compiles_on_a_big_stack_and_a_slow_one_times_out(lenient_server):
    url = lenient_server.url
    before = complete(url, {}, **GREEDY).json()["choices"][0]["text"]
    r = complete(url, {"guided_grammar": chain_grammar(5000)}, max_tokens=4)
    assert r.status_code == 200, r.text  # the chain that overflowed an 8 MiB stack
    assert r.json()["choices"][0]["text"].startswith("t0t1")
    start = time.monotonic()
    r = complete(url, {"guided_choice": [f"option {i}" for i in range(300_000)]})
    assert r.status_code == 400 and "took longer than 2 s" in r.json()["error"]["message"], r.text
    assert time.monotonic() - start < 60
    assert lenient_server.proc.poll() is None
    assert complete(url, {}, **GREEDY).json()["choices"][0]["text"] == before
