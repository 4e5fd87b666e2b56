"""Tool calling through the official openai client: named functions and "required" give tool_calls whose
arguments match the function's schema (the grammar enforces it); the Hermes parser; bad tool fields."""

from __future__ import annotations

import dataclasses
import json
import random

import jsonschema
import openai
import pytest

from sarathi.entrypoints.openai.tool_calls import ToolFunction, ToolPlan
from sarathi.entrypoints.openai.tool_stream import ToolCallStream

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


def _streamed(client, model_name: str, **kwargs) -> tuple[list, str, dict[int, dict]]:
    chunks = list(client.chat.completions.create(model=model_name, stream=True, **kwargs))
    content, calls = "", {}
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for t in delta.tool_calls or ():
            call = calls.setdefault(t.index, {"name": None, "arguments": "", "id": None})
            call["name"] = t.function.name or call["name"]
            call["id"] = t.id or call["id"]
            call["arguments"] += t.function.arguments or ""
    return chunks, content, calls


def test_streamed_tool_calls_come_token_by_token(openai_client, model_name):
    for choice in (NAMED, "required"):
        kwargs = {
            "messages": MESSAGES,
            "tools": TOOLS,
            "tool_choice": choice,
            "max_tokens": 80,
            "temperature": 0,
        }
        chunks, _, calls = _streamed(openai_client, model_name, **kwargs)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert calls and all(c["id"] for c in calls.values())
        for call in calls.values():
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        with_arguments = [
            c for c in chunks if any(t.function.arguments for t in c.choices[0].delta.tool_calls or ())
        ]
        assert len(with_arguments) > 3  # the arguments stream as they are generated, not at the end
        whole = (
            openai_client.chat.completions.create(model=model_name, **kwargs).choices[0].message.tool_calls
        )
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
            (t.function.name, json.loads(t.function.arguments)) for t in whole
        ]


def test_auto_streaming_matches_the_whole_response(openai_client, model_name):
    client, model = openai_client, model_name  # "auto" works on a default server
    # SmolLM2-135M does not write Hermes calls by itself: a regex makes it write content, then a call.
    forced = (
        r"Let me check\.\n<tool_call>\n"
        r'\{"name": "get_time", "arguments": \{"zone": "[A-Z]{3,5}"\}\}\n</tool_call>'
    )
    for extra in ({}, {"guided_regex": forced}):
        kwargs = {
            "messages": MESSAGES,
            "tools": TOOLS,
            "max_tokens": 60,
            "temperature": 0,
            "extra_body": extra,
        }
        whole = client.chat.completions.create(model=model, **kwargs).choices[0]
        chunks, content, calls = _streamed(client, model, **kwargs)
        expected = [
            (t.function.name, json.loads(t.function.arguments)) for t in whole.message.tool_calls or ()
        ]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == expected
        assert " ".join(content.split()) == " ".join((whole.message.content or "").split())
        assert chunks[-1].choices[0].finish_reason == whole.finish_reason
        if extra:
            assert [name for name, _ in expected] == ["get_time"] and whole.finish_reason == "tool_calls"
            assert content.strip() == "Let me check."


@pytest.mark.parametrize("seed", range(5))
def test_tool_call_stream_splits_anywhere(seed):
    rng = random.Random(seed)
    required = (
        '[{"name":"get_weather","parameters":{"city":"Pa\\"ris","n":[1,{"a":"}"}]}},'
        '{"parameters":{},"name":"g"}]'
    )
    auto = (
        'Sure <b> let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "<tool_call>", '
        '"deg": 3.5}}\n</tool_call>\nand <tool_call>{"arguments": {}, "name": "now"}</tool_call> done <tool'
    )
    plan = ToolPlan("required", (ToolFunction("f", "", {"type": "object"}),))
    for mode, text in [("required", required), ("auto", auto)]:
        stream, content, calls, i = ToolCallStream(mode), "", {}, 0
        while i < len(text):
            step = rng.randint(1, 5)
            piece, i = text[i : i + step], i + step
            new, deltas = stream.feed(piece, finished=i >= len(text))
            content += new
            for d in deltas:
                call = calls.setdefault(d["index"], {"name": d["function"].get("name"), "arguments": ""})
                call["arguments"] += d["function"]["arguments"]
        expected_content, expected = dataclasses.replace(plan, mode=mode).parse(text)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
            (c.name, json.loads(c.arguments)) for c in expected
        ]
        assert " ".join(content.split()) == " ".join((expected_content or "").split())


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
    assert content == 'Let me check.\n\n<tool_call>{"name": "g"'  # not cut off: a broken call stays text
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1})]
    content, calls = plan.parse(text, cut=True)  # cut off by max_tokens: the unfinished call is dropped
    assert content == "Let me check." and [c.name for c in calls] == ["f"]
    assert plan.parse("no calls here") == ("no calls here", [])


TWO_CALLS = (
    r'<tool_call>\n\{"name": "get_time", "arguments": \{"zone": "[A-Z]{3}"\}\}\n</tool_call>\n'
    r'<tool_call>\n\{"name": "get_weather", "arguments": '
    r'\{"city": "Rome", "unit": "celsius"\}\}\n</tool_call>'
)
MANY = [
    {"role": "user", "content": "What is the weather and time in Paris, London and Rome? Call the tools."}
]


def test_tools_alone_work_on_a_default_server(openai_client, model_name):
    r = openai_client.chat.completions.create(model=model_name, messages=MESSAGES, tools=TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    forced = openai_client.chat.completions.create(
        model=model_name, messages=MANY, tools=TOOLS, max_tokens=80, extra_body={"guided_regex": TWO_CALLS}
    ).choices[0]
    assert forced.finish_reason == "tool_calls" and forced.message.content is None
    assert [t.function.name for t in forced.message.tool_calls] == ["get_time", "get_weather"]
    _check_calls(forced.message.tool_calls)


def test_parallel_tool_calls_false_gives_exactly_one_call(openai_client, model_name):
    base = {"model": model_name, "messages": MANY, "tools": TOOLS, "max_tokens": 80}
    # "required" at seed 2 writes three calls (seeds 0-7: 1, 1, 3, 1, 3, 1, 3, 1); the grammar allows one.
    many = openai_client.chat.completions.create(tool_choice="required", temperature=1.0, seed=2, **base)
    assert len(many.choices[0].message.tool_calls) > 1
    one = openai_client.chat.completions.create(
        tool_choice="required", temperature=1.0, seed=2, parallel_tool_calls=False, **base
    ).choices[0]
    assert one.finish_reason == "tool_calls" and len(one.message.tool_calls) == 1
    _check_calls(one.message.tool_calls)
    # "auto": the output ends after the first call, streamed or not.
    kwargs = {**base, "parallel_tool_calls": False, "extra_body": {"guided_regex": TWO_CALLS}}
    auto = openai_client.chat.completions.create(**kwargs).choices[0]
    assert auto.finish_reason == "tool_calls"
    assert [t.function.name for t in auto.message.tool_calls] == ["get_time"]
    kwargs.pop("model")
    chunks, _, calls = _streamed(openai_client, model_name, **kwargs)
    assert [c["name"] for c in calls.values()] == ["get_time"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_truncated_answer_returns_its_complete_calls(openai_client, model_name):
    base = {"messages": MANY, "tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "seed": 2}
    chunks, _, streamed = _streamed(openai_client, model_name, max_tokens=80, **base)
    assert len(streamed) >= 2, streamed
    # One chunk per token: the token that completes the second call's name (same seed: the same tokens).
    cut_at = 1 + next(
        k for k, c in enumerate(chunks) if any(t.index == 1 for t in c.choices[0].delta.tool_calls or ())
    )
    cut = openai_client.chat.completions.create(model=model_name, max_tokens=cut_at, **base).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None
    first = streamed[0]
    assert [(t.function.name, json.loads(t.function.arguments)) for t in cut.message.tool_calls] == [
        (first["name"], json.loads(first["arguments"]))
    ]
