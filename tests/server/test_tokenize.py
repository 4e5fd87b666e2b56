"""/tokenize and /detokenize with vLLM's shapes, on the session's live server."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import post_body

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_tokenize_prompt_and_detokenize_round_trip(server, model_name):
    r = post_body(f"{server.url}/tokenize", {"model": model_name, "prompt": "The capital of France is"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"} and body["token_strs"] is None
    assert body["count"] == len(body["tokens"]) == 5 and body["max_model_len"] > 0
    back = post_body(f"{server.url}/detokenize", {"model": model_name, "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": "The capital of France is"}
    strs = post_body(f"{server.url}/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert strs["token_strs"] == ["Hello", "Ġworld"]


def test_tokenize_messages_counts_what_chat_completions_bills(server, openai_client, model_name):
    body = post_body(f"{server.url}/tokenize", {"messages": MESSAGES, "add_generation_prompt": True}).json()
    chat = openai_client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=1)
    assert body["count"] == chat.usage.prompt_tokens
    without = post_body(f"{server.url}/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert without.json()["count"] < body["count"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("tokenize", {}, "prompt"),
        ("tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt"),
        ("tokenize", {"prompt": 5}, "prompt"),
        ("tokenize", {"messages": []}, "messages"),
        ("tokenize", {"prompt": "a", "model": "nope"}, "model"),
        ("detokenize", {"tokens": "abc"}, "tokens"),
        ("detokenize", {"tokens": [1, -2]}, "tokens.1"),
        ("detokenize", {"tokens": [1, 10_000_000]}, "tokens"),
        ("detokenize", {"tokens": [True]}, "tokens.0"),
    ],
)
def test_tokenize_bad_input(server, path, body, param):
    r = post_body(f"{server.url}/{path}", body)
    assert r.status_code == (404 if param == "model" else 400), r.text
    assert r.json()["error"]["param"] == param


def test_bad_json_on_tokenize(server):
    r = httpx.post(f"{server.url}/tokenize", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_tokenize_with_tools_counts_the_tool_prompt(server, openai_client, model_name):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    with_tools = post_body(f"{server.url}/tokenize", {"messages": MESSAGES, "tools": tools}).json()
    chat = openai_client.chat.completions.create(
        model=model_name, messages=MESSAGES, tools=tools, max_tokens=1
    )
    assert with_tools["count"] == chat.usage.prompt_tokens
    plain = post_body(f"{server.url}/tokenize", {"messages": MESSAGES}).json()
    assert with_tools["count"] > plain["count"]
    body = {"messages": MESSAGES, "tools": tools, "tool_choice": "none"}
    hidden = post_body(f"{server.url}/tokenize", body)
    assert hidden.json()["count"] == plain["count"]


def test_model_by_id(server, model_name):
    card = httpx.get(f"{server.url}/v1/models/{model_name}", timeout=10).json()
    assert card["id"] == model_name and card["object"] == "model"
    missing = httpx.get(f"{server.url}/v1/models/nope", timeout=10)
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
