"""Every bad request gets a 4xx with an OpenAI-style error body, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import post_body

LONG_TEXT = "hello " * 9000  # more tokens than the model's 8192 context

CASES = [
    # (endpoint, body or raw bytes, status, param)
    ("completions", b'{"prompt": "hi", "max_tokens": ', 400, None),
    ("completions", b"[1, 2, 3]", 400, None),
    ("completions", {"max_tokens": 5}, 400, "prompt"),
    ("completions", {"prompt": 12}, 400, "prompt"),
    ("completions", {"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("completions", {"prompt": ""}, 400, "prompt"),
    ("completions", {"prompt": []}, 400, "prompt"),
    ("completions", {"prompt": [1, 2, 10_000_000]}, 400, "prompt"),
    ("completions", {"prompt": LONG_TEXT}, 400, "prompt"),
    ("completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("completions", {"prompt": "hi", "n": 3, "best_of": 2}, 400, "best_of"),
    ("completions", {"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    ("completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("completions", {"prompt": "hi", "min_tokens": 20, "max_tokens": 5}, 400, "min_tokens"),
    ("completions", {"prompt": [["a"]]}, 400, "prompt"),
    ("completions", {"prompt": "hi", "logit_bias": {"10000000": 1}}, 400, "logit_bias"),
    ("completions", {"prompt": "hi", "logit_bias": {"7": 500}}, 400, "logit_bias"),
    ("completions", {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ("completions", {"prompt": "hi", "repetition_penalty": -1}, 400, "repetition_penalty"),
    ("completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ("completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": "hello"}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages.0.content",
    ),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
        400,
        "max_tokens",
    ),
    ("chat/completions", {"messages": [{"role": "user", "content": LONG_TEXT}]}, 400, "messages"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3},
        400,
        "top_logprobs",
    ),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "min_p": 2}, 400, "min_p"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "nope"}, 404, "model"),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "param"), CASES)
def test_bad_request_gets_openai_error(server, endpoint, body, status, param):
    r = post_body(f"{server.url}/v1/{endpoint}", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error


def test_unknown_route_and_method_are_json_errors(server):
    r = httpx.get(f"{server.url}/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = httpx.get(f"{server.url}/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_fields_common_clients_send_are_accepted(server, model_name):
    body = {
        "model": model_name,
        "prompt": "Hello",
        "max_tokens": 3,
        "temperature": 0,
        "best_of": 1,
        "repetition_penalty": 1.0,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "user": "someone",
        "some_future_field": {"x": 1},
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) == 3 + 1 + 1  # 3 tokens, usage, DONE


def test_server_keeps_serving_after_bad_requests(server):
    for _, body, _, _ in CASES[:5]:
        httpx.post(
            f"{server.url}/v1/completions",
            content=body if isinstance(body, bytes) else None,
            json=None if isinstance(body, bytes) else body,
        )
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(f"{server.url}/health").status_code == 200
