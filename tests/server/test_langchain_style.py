"""The request bodies LangChain's ChatOpenAI sends, at the HTTP level (no LangChain dependency): tools bound
with ``bind_tools`` (no ``tool_choice``), and ``with_structured_output`` by ``json_schema`` and by
``function_calling`` (a named tool with ``parallel_tool_calls: false``)."""

from __future__ import annotations

import json

import httpx
import jsonschema

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON_TOOL = {
    "type": "function",
    "function": {"name": "Person", "description": "A person.", "parameters": PERSON, "strict": True},
}
MESSAGES = [{"role": "user", "content": "Alice is 31 years old. Extract the person."}]


def _chat(server, model_name: str, **body) -> dict:
    # ChatOpenAI's defaults: n and stream always sent.
    payload = {"model": model_name, "messages": MESSAGES, "n": 1, "stream": False, "temperature": 0, **body}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=payload, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_bind_tools_without_tool_choice(server, model_name):
    choice = _chat(server, model_name, tools=[PERSON_TOOL], max_tokens=24)
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    for call in choice["message"].get("tool_calls") or ():
        assert call["function"]["name"] == "Person"


def test_with_structured_output_json_schema(server, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "Person", "strict": True, "schema": PERSON}}
    choice = _chat(server, model_name, response_format=fmt, max_tokens=40)
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_with_structured_output_function_calling(server, model_name):
    choice = _chat(
        server,
        model_name,
        tools=[PERSON_TOOL],
        tool_choice={"type": "function", "function": {"name": "Person"}},
        parallel_tool_calls=False,
        max_tokens=40,
    )
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "Person" and call["id"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), PERSON)
