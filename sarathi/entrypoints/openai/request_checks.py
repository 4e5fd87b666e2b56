"""Request checks shared by the endpoints: parse a body into its pydantic model, the model name, prompt
encoding and the engine's SamplingParams. Every failure is an APIError naming the field."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from sarathi.entrypoints.openai.errors import APIError, invalid_request, validation_error
from sarathi.entrypoints.openai.guards import read_body
from sarathi.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from sarathi.entrypoints.openai.refusals import Refusal, check_refusals
from sarathi.entrypoints.openai.server_state import ServerState
from sarathi.entrypoints.openai.structured_requests import structured_output_of
from sarathi.entrypoints.openai.tool_calls import ToolPlan, conversation, with_tool_prompt
from sarathi.sampling_params import InvalidRequestError, SamplingParams


async def parse_request(
    state: ServerState,
    raw: Request,
    model: type[BaseModel],
    refusals: tuple[Refusal, ...] = (),
    size_check: Callable[[dict], None] | None = None,
) -> Any:
    """The body as ``model``; then its own checks and the ``refusals`` of fields we do not honour.
    ``size_check`` sees the raw JSON object first, so an oversized list is refused before validation."""
    data = await read_body(raw, state.limits.max_body_bytes)
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:  # ValueError: bad JSON, or an integer of > 4300 digits
        raise APIError(f"the request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise APIError("the request body is nested too deeply") from e
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    if size_check is not None:
        size_check(body)
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError("the request body contains a lone UTF-16 surrogate (e.g. \\ud800)") from e
    except RecursionError as e:
        raise APIError("the request body is nested too deeply") from e
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from e
    req.check_supported()
    check_refusals(body, refusals)
    return req


def check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise APIError(
            f"the model {name!r} does not exist; this server serves {state.model_name!r}",
            404,
            param="model",
            type="not_found_error",
            code="model_not_found",
        )


async def encode_prompt(state: ServerState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str) and prompt:
        state.limits.check_prompt_chars(len(prompt), state.max_model_len, "prompt")
        # Off the event loop: a long prompt must not stall /health and every open stream.
        return await asyncio.to_thread(state.processor.prompt_token_ids, prompt)
    return state.processor.prompt_token_ids(prompt)


async def encode_chat(
    state: ServerState,
    messages: list[ChatMessage],
    add_generation_prompt: bool = True,
    add_special_tokens: bool = False,
    tools: ToolPlan | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered with the model's chat template (the ``tools`` in the system
    message)."""
    if state.tokenizer is None:
        raise APIError("this model has no tokenizer", param="messages")
    turns = conversation(messages)
    if tools is not None:
        turns = with_tool_prompt(turns, tools)
    state.limits.check_prompt_chars(sum(len(m["content"]) for m in turns), state.max_model_len, "messages")
    try:
        return await asyncio.to_thread(
            state.tokenizer.apply_chat_template, turns, add_generation_prompt, add_special_tokens
        )
    except ValueError as e:
        raise APIError(str(e), param="messages") from e


def sampling_params_for(
    state: ServerState,
    req,
    num_prompt_tokens: int,
    max_tokens: int | None,
    prompt_param: str,
    tools: ToolPlan | None = None,
) -> SamplingParams:
    room = state.max_model_len - num_prompt_tokens
    if room < 1:
        raise APIError(
            f"{prompt_param}: the prompt has {num_prompt_tokens} tokens, but this model's maximum context "
            f"length is {state.max_model_len} tokens (prompt and output together)",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if max_tokens is None:
        max_tokens = room
    elif max_tokens > room:
        raise APIError(
            f"max_tokens: {max_tokens} output tokens were requested, but the prompt has {num_prompt_tokens} "
            f"tokens and this model's maximum context length is {state.max_model_len}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    state.limits.check_choices(req.n, req.best_of)
    state.limits.check_stop(req.stop_strings())
    logprobs_param = "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs"
    state.limits.check_logprobs(req.num_logprobs(), logprobs_param)
    constraint = structured_output_of(req)
    if tools is not None and (tool_constraint := tools.constraint()) is not None:
        if constraint is not None:
            raise APIError(
                "tool_choice: 'required' or a named function cannot be combined with a structured output",
                param="tool_choice",
            )
        constraint = dataclasses.replace(tool_constraint, source="tools")
    try:  # SamplingParams checks the ranges, the input processor the token ids and the constraint's bounds
        params = req.sampling_params(max_tokens)
        if tools is not None and tools.stop_strings():
            params = dataclasses.replace(params, stop=(*params.stop, *tools.stop_strings()))
        if constraint is not None:
            params = dataclasses.replace(params, structured_output=constraint)
        return state.processor.check_params(params)
    except InvalidRequestError as e:
        raise invalid_request(e, logprobs_param if e.param == "logprobs" else None) from None
