"""Tool calling through the official openai client: named functions and "required" give tool_calls whose
arguments match the function's schema (the grammar enforces it); the Hermes parser; bad tool fields."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from sarathi.entrypoints.openai.tool_calls import ToolFunction, ToolPlan

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 8}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Time now", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_function_and_required(openai_client, model_name):
    for choice, temperature in [(NAMED, 0.0), ("required", 0.0), ("required", 1.0)]:
        r = openai_client.chat.completions.create(
            model=model_name,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=80,
            temperature=temperature,
            seed=3,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        _check_calls(c.message.tool_calls)
        if choice == NAMED:
            assert [t.function.name for t in c.message.tool_calls] == ["get_weather"]


def test_streamed_tool_calls(openai_client, model_name):
    for choice in (NAMED, "required"):
        chunks = list(
            openai_client.chat.completions.create(
                model=model_name,
                messages=MESSAGES,
                tools=TOOLS,
                tool_choice=choice,
                max_tokens=80,
                stream=True,
            )
        )
        calls: dict[int, dict] = {}
        for chunk in chunks:
            for t in chunk.choices[0].delta.tool_calls or ():
                call = calls.setdefault(t.index, {"name": None, "arguments": ""})
                call["name"] = t.function.name or call["name"]
                call["arguments"] += t.function.arguments or ""
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert calls
        for call in calls.values():
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_a_conversation_with_earlier_calls_renders(openai_client, model_name):
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"zone": "CET"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    r = openai_client.chat.completions.create(
        model=model_name, messages=history, tools=TOOLS, tool_choice="none", max_tokens=3
    )
    assert r.choices[0].message.tool_calls is None


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),  # this server has no --enable-auto-tool-choice
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    ],
)
def test_bad_tool_fields_are_a_400(openai_client, model_name, kwargs, param):
    body = {"tools": TOOLS, **kwargs}
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=1, **body)
    assert e.value.body["param"] == param, e.value.body


def test_hermes_parser():
    plan = ToolPlan("auto", (ToolFunction("f", "", {"type": "object"}),))
    text = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
    text += '<tool_call>{"name": "g"'
    content, calls = plan.parse(text)
    assert content == 'Let me check.\n\n<tool_call>{"name": "g"'  # the cut call stays text
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1})]
    assert plan.parse("no calls here") == ("no calls here", [])
