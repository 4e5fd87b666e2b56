"""``POST /v1/responses``: OpenAI's Responses API over the chat path (its chat template rendering, tool
planning and structured outputs) and one engine request, answered whole or as a stream of events.

Stateless (as vLLM's): nothing is stored; see ``responses_protocol`` for what is refused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sarathi.engine.core_client import EngineDeadError, RequestStream
from sarathi.entrypoints.openai.engine_requests import collect, deltas, engine_dead, request_error, submit
from sarathi.entrypoints.openai.refusals import RESPONSES
from sarathi.entrypoints.openai.request_checks import (
    check_model,
    encode_chat,
    parse_request,
    sampling_params_for,
)
from sarathi.entrypoints.openai.responses_format import ResponseEvents, ResponseFormat
from sarathi.entrypoints.openai.responses_protocol import ResponsesRequest, responses_param_names
from sarathi.entrypoints.openai.server_state import ServerState
from sarathi.entrypoints.openai.tool_calls import plan_tools


def add_responses_routes(app: FastAPI, state: ServerState) -> None:
    """Register ``POST /v1/responses`` on ``app``."""

    @app.post("/v1/responses")
    async def responses(raw: Request) -> Response:
        req: ResponsesRequest = await parse_request(state, raw, ResponsesRequest, RESPONSES)
        check_model(state, req.model)
        with responses_param_names():
            plan = plan_tools(
                req.chat_tools,
                req.chat_tool_choice,
                state.tool_call_parser,
                state.enable_auto_tool_choice,
                parallel=req.parallel_tool_calls is not False,
            )
            prompt_ids = await encode_chat(state, req.messages(), tools=plan)
            params = sampling_params_for(state, req, len(prompt_ids), req.max_output_tokens, "input", plan)
            response_id = f"resp_{uuid.uuid4().hex}"
            stream = await submit(state, response_id, prompt_ids, params, None)  # compiles text.format
        state.metrics.observe_request_params(params)
        fmt = ResponseFormat(response_id, int(time.time()), state.model_name, req.echoed(), plan)
        if req.stream:
            events = _events(state, raw, stream, len(prompt_ids), fmt)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        try:
            result = await collect(state, raw, stream, len(prompt_ids), params)
        except EngineDeadError as e:
            raise engine_dead(e) from None
        if result is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        return JSONResponse(fmt.final(result))


async def _events(
    state: ServerState, raw: Request, stream: RequestStream, num_prompt_tokens: int, fmt: ResponseFormat
) -> AsyncIterator[str]:
    builder = ResponseEvents(fmt)
    for event in builder.start():
        yield _sse(event)
    try:
        async for delta in deltas(state, raw, stream, num_prompt_tokens):
            if delta.error is not None:
                yield _sse(_error_event(builder, request_error(delta)))
                return
            for event in builder.feed(delta):
                yield _sse(event)
    except EngineDeadError as e:
        yield _sse(_error_event(builder, engine_dead(e)))


def _error_event(builder: ResponseEvents, error) -> dict:
    return builder.event("error", code=error.code, message=error.message, param=error.param)


def _sse(event: dict) -> str:
    """A Responses event: named by its type, as OpenAI sends them (no ``[DONE]`` at the end)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"
