"""Running one engine request for an endpoint: submit it, read its deltas (aborting it when the client goes
away), collect its whole output, and the error and SSE shapes every endpoint shares."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from fastapi import Request

from sarathi.engine.core_client import EngineDeadError, RequestRejectedError, RequestStream
from sarathi.engine.core_messages import RejectReason
from sarathi.engine.input_processor import EngineRequest
from sarathi.entrypoints.openai.choices import ChoiceResult
from sarathi.entrypoints.openai.errors import APIError
from sarathi.entrypoints.openai.server_state import ServerState
from sarathi.entrypoints.openai.structured_requests import check_constraints
from sarathi.outputs import RequestOutput, TokenLogprob
from sarathi.sampling_params import SamplingParams

# How often a request waiting for its next token checks whether its client went away.
DISCONNECT_POLL_S = 0.5


async def submit(
    state: ServerState, request_id: str, prompt_ids: list[int], params: SamplingParams, after: str | None
) -> RequestStream:
    """Hand a request to the engine core; its rejection as the matching APIError (400, 429, 500, 503).
    A structured output is compiled first, in the constraint checker's helper process (crash isolation);
    the sampling worker builds its matcher again, unavoidably: the matcher lives in the worker's process."""
    if params.structured_output is not None:
        await check_constraints(state.constraints, [params.structured_output])
    try:
        return await state.client.add_request(
            request_id, EngineRequest(prompt_ids, params), time.monotonic(), after
        )
    except RequestRejectedError as e:
        state.metrics.observe_request_end("rejected", 0)
        r = e.rejection
        if r.reason is RejectReason.OVERLOADED:
            raise APIError(
                r.message, 429, type="rate_limit_error", code="overloaded", headers={"Retry-After": "1"}
            ) from e
        if r.reason is RejectReason.INTERNAL:
            raise internal_error(r.message) from e
        raise APIError(r.message, param=r.param, code=r.code) from e
    except EngineDeadError as e:
        raise engine_dead(e) from e


async def collect(
    state: ServerState, raw: Request, stream: RequestStream, num_prompt_tokens: int, params: SamplingParams
) -> ChoiceResult | None:
    """A request's whole output; None if the client went away first."""
    text, finish, num_output, prompt_logprobs, cached = [], None, 0, None, 0
    logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
    async for delta in deltas(state, raw, stream, num_prompt_tokens):
        if delta.error is not None:
            raise request_error(delta)
        text.append(delta.new_text)
        finish, num_output, cached = delta.finish_reason, delta.num_output_tokens, delta.num_cached_tokens
        if logprobs is not None:
            logprobs.extend(delta.new_logprobs or ())
        if delta.prompt_logprobs is not None:
            prompt_logprobs = delta.prompt_logprobs
    if finish is None:
        return None
    return ChoiceResult(
        "".join(text), finish, logprobs, num_prompt_tokens, num_output, prompt_logprobs, cached
    )


async def deltas(
    state: ServerState, raw: Request, stream: RequestStream, num_prompt_tokens: int
) -> AsyncIterator[RequestOutput]:
    """A request's deltas; aborts it in the engine if the client disconnects or the consumer stops early."""
    checked, num_output = time.monotonic(), 0
    try:
        while not stream.finished:
            delta = await stream.next(timeout=DISCONNECT_POLL_S)
            # Checked while tokens flow too: a non-streaming client that left is only seen this way.
            if delta is None or time.monotonic() - checked >= DISCONNECT_POLL_S:
                checked = time.monotonic()
                if await raw.is_disconnected():
                    return
            if delta is None:
                continue
            num_output = delta.num_output_tokens
            if delta.finished:
                state.metrics.observe_request_end(
                    delta.finish_reason, num_prompt_tokens, delta.metrics, num_output
                )
            yield delta
    except EngineDeadError:
        state.metrics.observe_request_end("error", num_prompt_tokens, None, num_output)
        raise
    finally:
        if not stream.finished:
            state.metrics.observe_request_end("abort", num_prompt_tokens, None, num_output)
            stream.close()


def request_error(failed: RequestOutput) -> APIError:
    """Why the engine failed a request: a 400 when its own structured output failed (a constraint the
    grammar library could compile but not follow), else a 500."""
    if failed.error_code == "invalid_structured_output":
        return APIError(failed.error or "structured output failed", param=None, code=failed.error_code)
    return internal_error(failed.error or "unknown error")


def internal_error(message: str) -> APIError:
    """A 500 for a request the engine failed (a server bug); other requests are unaffected."""
    return APIError(f"internal error: {message}", 500, type="internal_server_error", code="internal_error")


def engine_dead(e: EngineDeadError) -> APIError:
    """A 503: the engine core is gone."""
    return APIError(str(e), 503, type="server_error", code="engine_dead")


def sse(payload: dict) -> str:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
