"""Every request field we do not honour is a 400 naming it (through the official openai client), while
its neutral value, or leaving it out, still works."""

from __future__ import annotations

import openai
import pytest

from sarathi.entrypoints.openai import refusals

MESSAGES = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

# field -> a value that asks for something this server does not do
BOTH = {
    "use_beam_search": True,
    "length_penalty": 0.5,
    "early_stopping": True,
    "allowed_token_ids": [1, 2],
    "bad_words": ["x"],
    "logits_processors": ["x"],
    "truncate_prompt_tokens": 4,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "return_tokens_as_token_ids": True,
    "priority": 1,
}
COMPLETIONS = {**BOTH, "suffix": " the end", "add_special_tokens": False}
CHAT = {
    **BOTH,
    "functions": [TOOL["function"]],
    "function_call": "auto",
    "chat_template": "{{ messages }}",
    "chat_template_kwargs": {"enable_thinking": True},
    "continue_final_message": True,
    "documents": [{"text": "x"}],
    "echo": True,
    "add_special_tokens": True,
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"},
}


def test_the_lists_match_the_server_table():
    assert set(COMPLETIONS) == {r.field for r in refusals.COMPLETIONS}
    assert set(CHAT) == {r.field for r in refusals.CHAT}


def _refused(create, field: str, value, **kwargs) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        create(max_tokens=1, extra_body={field: value}, **kwargs)
    error = e.value.body
    assert e.value.status_code == 400 and error["param"] == field and error["code"] == "unsupported", error
    assert error["message"].startswith(f"{field}: ")


def test_every_unsupported_field_is_refused(openai_client, model_name):
    for field, value in COMPLETIONS.items():
        _refused(openai_client.completions.create, field, value, model=model_name, prompt="hi")
    for field, value in CHAT.items():
        _refused(openai_client.chat.completions.create, field, value, model=model_name, messages=MESSAGES)


def test_neutral_values_are_accepted(openai_client, model_name):
    neutral = {
        "n": 1,
        "best_of": 1,
        "use_beam_search": False,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "logit_bias": {},
        "min_p": 0.0,
        "skip_special_tokens": True,
        "response_format": {"type": "text"},
        "guided_json": None,
    }
    r = openai_client.completions.create(
        model=model_name, prompt="hi", max_tokens=1, extra_body={**neutral, "echo": False, "suffix": ""}
    )
    assert r.usage.completion_tokens == 1
    r = openai_client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        max_tokens=1,
        extra_body={**neutral, "tools": [], "tool_choice": "none", "continue_final_message": False},
    )
    assert r.usage.completion_tokens == 1
