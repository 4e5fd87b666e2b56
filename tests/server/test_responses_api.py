"""POST /v1/responses through the official openai client with strict validation: text, json_schema and a
function-tool round trip, whole and streamed; refused fields name themselves."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather now", "parameters": CITY}
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def strict_client(server):
    return openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=300,
        _strict_response_validation=True,
    )


def _check_sequence(events) -> None:
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]


def test_text_whole_and_streamed(strict_client, model_name):
    kwargs = {
        "model": model_name,
        "input": "What is the capital of France?",
        "instructions": "Answer in one short sentence.",
        "max_output_tokens": 12,
        "temperature": 0,
    }
    r = strict_client.responses.create(**kwargs)
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.output_text and [item.type for item in r.output] == ["message"]
    assert (
        r.usage.output_tokens <= 12 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    )
    assert r.usage.output_tokens_details.reasoning_tokens == 0

    events = list(strict_client.responses.create(stream=True, **kwargs))
    _check_sequence(events)
    types = [e.type for e in events]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert types[-1] == ("response.completed" if r.status == "completed" else "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == r.output_text and final.usage.output_tokens == r.usage.output_tokens


def test_json_schema_format(strict_client, model_name):
    fmt = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}
    r = strict_client.responses.create(
        model=model_name,
        input="Name the capital of France as JSON.",
        text={"format": fmt},
        max_output_tokens=40,
        temperature=0,
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), CITY)


def test_function_tool_round_trip(strict_client, model_name):
    first = strict_client.responses.create(
        model=model_name,
        input=QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), CITY)

    history = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": calls[0].call_id,
            "name": "get_weather",
            "arguments": calls[0].arguments,
        },
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"},
    ]
    answer = strict_client.responses.create(
        model=model_name, input=history, tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=16
    )
    assert [item.type for item in answer.output] == ["message"] and answer.output_text


def test_function_call_streamed(strict_client, model_name):
    events = list(
        strict_client.responses.create(
            model=model_name,
            input=QUESTION,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    _check_sequence(events)
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == 1 and added[0].item.type == "function_call"
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert len(pieces) > 2 and "".join(pieces) == done.arguments
    final = events[-1]
    assert final.type == "response.completed" and final.response.output[0].arguments == done.arguments
    jsonschema.validate(json.loads(done.arguments), CITY)


def test_auto_tool_choice_reads_a_hermes_call(strict_client, model_name):
    # SmolLM2-135M does not write Hermes calls by itself: a regex makes it write one.
    forced = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n</tool_call>'
    r = strict_client.responses.create(
        model=model_name,
        input=QUESTION,
        tools=[WEATHER_TOOL],
        max_output_tokens=40,
        temperature=0,
        extra_body={"guided_regex": forced},
    )
    assert [(i.type, i.name, json.loads(i.arguments)) for i in r.output] == [
        ("function_call", "get_weather", {"city": "Paris"})
    ]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools.0.type"),
        ({"input": [{"type": "reasoning", "id": "r", "summary": []}]}, "input.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0.type",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
            "text.format.schema",
        ),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER_TOOL]}, "tool_choice.name"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": ""}, "input"),
    ],
)
def test_unsupported_fields_are_a_400_naming_them(server, model_name, extra, param):
    body = {"model": model_name, "input": "hi", **extra}
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_input_items_become_chat_messages():
    from sarathi.entrypoints.openai.responses_protocol import ResponsesRequest

    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Rome"}'}
    req = ResponsesRequest.model_validate(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                call,
                {**call, "call_id": "c2"},
                {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            ],
        }
    )
    req.check_supported()
    messages = req.messages()
    assert [m.role for m in messages] == ["system", "system", "user", "assistant", "tool"]
    assert messages[2].content == QUESTION and messages[3].content == "Checking."
    assert [c["id"] for c in messages[3].tool_calls] == ["c1", "c2"]  # one assistant turn, both calls
    assert messages[4].tool_call_id == "c1" and messages[4].content == "Sunny"
