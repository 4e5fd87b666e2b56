"""`sarathi serve --model gemma3-270m`: Gemma 3's chat template, streaming, structured outputs over its
262,144-token vocabulary, and tools, through the openai client."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import ServerProcess

from sarathi.model.embedded import packaged_model_path


@pytest.fixture(scope="module")
def gemma():
    srv = ServerProcess("--model", "gemma3-270m", "--num-kv-blocks", "512")
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)
    yield srv, client
    srv.stop()


def test_chat_renders_gemma_turns_as_transformers_does(gemma):
    """Without tools the server's prompt is transformers' apply_chat_template exactly. With tools the server
    writes its Hermes tool prompt into the system message (as for every model), which Gemma's format puts
    at the head of the first user turn."""
    import httpx
    from transformers import AutoTokenizer

    srv, _ = gemma
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ]
    tok = AutoTokenizer.from_pretrained(packaged_model_path("gemma3-270m"))
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert expected == (
        "<bos><start_of_turn>user\nAnswer briefly.\n\nName a colour.<end_of_turn>\n"
        "<start_of_turn>model\nBlue.<end_of_turn>\n<start_of_turn>user\nAnother?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    got = httpx.post(f"{srv.url}/tokenize", json={"messages": messages}, timeout=60).json()
    assert got["tokens"] == tok(expected, add_special_tokens=False)["input_ids"]

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    got = httpx.post(f"{srv.url}/tokenize", json={"messages": messages, "tools": tools}, timeout=60).json()
    text = tok.decode(got["tokens"])
    assert text.startswith("<bos><start_of_turn>user\nAnswer briefly.\n\n") and "get_weather" in text
    assert text.count("<start_of_turn>user") == 2 and text.endswith("<start_of_turn>model\n")


def test_chat_streams_and_stops_at_end_of_turn(gemma):
    _, client = gemma
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=12,
        temperature=0.0,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(pieces) >= 2 and "<end_of_turn>" not in "".join(pieces)


def test_json_schema_output_parses_at_262k_vocabulary(gemma):
    _, client = gemma
    model = client.models.list().data[0].id
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give a city and its population as JSON."}],
        max_tokens=60,
        temperature=0.0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"city", "population"} and isinstance(value["population"], int)


def test_required_tool_call_parses(gemma):
    _, client = gemma
    model = client.models.list().data[0].id
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"],
                },
            },
        }
    ]
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools,
        tool_choice="required",
        max_tokens=60,
        temperature=0.0,
    )
    calls = out.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)
