"""The FastAPI app: OpenAI-compatible completions and chat completions over an engine-core process.

Tokenization happens here; the engine core detokenizes (holding back partial UTF-8 characters and text
that may still turn into a stop string) so streamed text always equals the final text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import sarathi
from sarathi.engine.core_client import EngineCoreClient, EngineDeadError, RequestRejectedError, RequestStream
from sarathi.entrypoints.openai.guards import AccessPolicy, RequestLimits, install_access_policy, read_body
from sarathi.entrypoints.openai.openapi_docs import document_request_bodies
from sarathi.entrypoints.openai.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    validation_error,
)
from sarathi.entrypoints.openai.server_metrics import ServerMetrics
from sarathi.outputs import RequestOutput, TokenLogprob
from sarathi.sampling_params import SamplingParams
from sarathi.tokenizer import Tokenizer

# How often a request waiting for its next token checks whether its client went away.
_DISCONNECT_POLL_S = 0.5


@dataclass
class ServerState:
    """What the endpoints share: the engine-core client, the tokenizer and the metrics."""

    client: EngineCoreClient
    model_name: str
    tokenizer: Tokenizer | None
    metrics: ServerMetrics
    created: int
    limits: RequestLimits = field(default_factory=RequestLimits)

    @property
    def max_model_len(self) -> int:
        return self.client.ready.max_model_len


def create_app(state: ServerState, policy: AccessPolicy | None = None) -> FastAPI:
    """The app for an already started engine core (``state.client.ready`` is set)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        # Runs once uvicorn has drained (or given up on) in-flight requests.
        await state.client.shutdown()
        print("sarathi serve: engine core stopped", flush=True)

    app = FastAPI(title="sarathi", version=sarathi.__version__, lifespan=lifespan)
    app.state.sarathi = state
    state.client.on_outputs = state.metrics.observe_core_outputs
    install_access_policy(app, policy or AccessPolicy())
    document_request_bodies(
        app, {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
    )

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        # A bug: still an OpenAI-style body, never a plain-text 500.
        return JSONResponse(_internal_error(f"{type(e).__name__}: {e}").body(), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            APIError(str(e.detail), e.status_code, type=kind).body(), status_code=e.status_code
        )

    @app.get("/health")
    async def health() -> Response:
        if not state.client.is_healthy:
            reason = state.client.dead_reason or "engine core is not responding"
            raise APIError(reason, 503, type="server_error", code="engine_dead")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": sarathi.__version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        state.metrics.in_flight.set(state.client.num_in_flight)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "sarathi",
            "max_model_len": state.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        req = await _parse(state, raw, CompletionRequest)
        _check_model(state, req.model)
        prompt = req.single_prompt()
        prompt_ids = await _encode_prompt(state, prompt)
        params = _sampling_params(state, req, len(prompt_ids), req.max_tokens, "prompt")
        return await _respond(
            state, raw, req, _CompletionFormat(state.model_name, state.tokenizer), prompt_ids, params
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        req = await _parse(state, raw, ChatCompletionRequest)
        _check_model(state, req.model)
        if state.tokenizer is None:
            raise APIError("this model has no tokenizer", param="messages")
        conversation = req.conversation()
        num_chars = sum(len(m["content"]) for m in conversation)
        state.limits.check_prompt_chars(num_chars, state.max_model_len, "messages")
        try:
            prompt_ids = await asyncio.to_thread(
                state.tokenizer.apply_chat_template, conversation, req.add_generation_prompt
            )
        except ValueError as e:
            raise APIError(str(e), param="messages") from e
        params = _sampling_params(state, req, len(prompt_ids), req.requested_max_tokens, "messages")
        return await _respond(
            state, raw, req, _ChatFormat(state.model_name, state.tokenizer), prompt_ids, params
        )

    return app


# --- request checks --------------------------------------------------------------------------------------


async def _parse(state: ServerState, raw: Request, model: type[BaseModel]) -> Any:
    data = await read_body(raw, state.limits.max_body_bytes)
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:  # ValueError: bad JSON, or an integer of > 4300 digits
        raise APIError(f"the request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise APIError("the request body is nested too deeply") from e
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
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
    return req


def _check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise APIError(
            f"the model {name!r} does not exist; this server serves {state.model_name!r}",
            404,
            param="model",
            type="not_found_error",
            code="model_not_found",
        )


async def _encode_prompt(state: ServerState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if state.tokenizer is None:
            raise APIError("this model has no tokenizer: send the prompt as token ids", param="prompt")
        state.limits.check_prompt_chars(len(prompt), state.max_model_len, "prompt")
        # Off the event loop: a long prompt must not stall /health and every open stream.
        ids = await asyncio.to_thread(state.tokenizer.encode, prompt) if prompt else []
    else:
        vocab = state.client.ready.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise APIError(f"prompt: token ids must be in [0, {vocab}), got {bad[:5]}", param="prompt")
        ids = list(prompt)
    if not ids:
        raise APIError("prompt: the prompt is empty", param="prompt")
    return ids


def _sampling_params(
    state: ServerState, req, num_prompt_tokens: int, max_tokens: int | None, prompt_param: str
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
    elif max_tokens < 1:
        raise APIError(f"max_tokens: must be at least 1, got {max_tokens}", param="max_tokens")
    elif max_tokens > room:
        raise APIError(
            f"max_tokens: {max_tokens} output tokens were requested, but the prompt has {num_prompt_tokens} "
            f"tokens and this model's maximum context length is {state.max_model_len}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    state.limits.check_stop(req.stop_strings())
    logprobs_param = "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs"
    state.limits.check_logprobs(req.num_logprobs(), logprobs_param)
    try:
        params = req.sampling_params(max_tokens)
    except ValueError as e:
        param = str(e).split(" ", 1)[0]
        raise APIError(str(e), param=param if param.isidentifier() else None) from e
    vocab = state.client.ready.vocab_size
    if bad := [t for t in params.stop_token_ids if t >= vocab]:
        raise APIError(
            f"stop_token_ids: token ids must be in [0, {vocab}), got {bad[:5]}", param="stop_token_ids"
        )
    return params


# --- responses -------------------------------------------------------------------------------------------


class _CompletionFormat:
    """JSON shapes of /v1/completions."""

    id_prefix = "cmpl"

    def __init__(self, model: str, tokenizer: Tokenizer | None) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def chunk(self, rid: str, created: int, delta: RequestOutput, first: bool) -> dict:
        choice = {
            "index": 0,
            "text": delta.new_text,
            "logprobs": self.logprobs(delta.new_logprobs),
            "finish_reason": delta.finish_reason,
        }
        return self._envelope(rid, created, "text_completion", [choice])

    def final(self, rid: str, created: int, text: str, finish: str | None, logprobs, usage: dict) -> dict:
        choice = {"index": 0, "text": text, "logprobs": self.logprobs(logprobs), "finish_reason": finish}
        return {**self._envelope(rid, created, "text_completion", [choice]), "usage": usage}

    def usage_chunk(self, rid: str, created: int, usage: dict) -> dict:
        return {**self._envelope(rid, created, "text_completion", []), "usage": usage}

    def logprobs(self, logprobs: list[TokenLogprob] | None) -> dict | None:
        if logprobs is None:
            return None
        tokens = [self._text(lp.token_id) for lp in logprobs]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{self._text(t): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }

    def _text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _envelope(self, rid: str, created: int, obj: str, choices: list) -> dict:
        return {"id": rid, "object": obj, "created": created, "model": self.model, "choices": choices}


class _ChatFormat(_CompletionFormat):
    """JSON shapes of /v1/chat/completions."""

    id_prefix = "chatcmpl"

    def chunk(self, rid: str, created: int, delta: RequestOutput, first: bool) -> dict:
        content = {"role": "assistant", "content": delta.new_text} if first else {"content": delta.new_text}
        choice = {
            "index": 0,
            "delta": content,
            "logprobs": self.logprobs(delta.new_logprobs),
            "finish_reason": delta.finish_reason,
        }
        return self._envelope(rid, created, "chat.completion.chunk", [choice])

    def final(self, rid: str, created: int, text: str, finish: str | None, logprobs, usage: dict) -> dict:
        message = {"role": "assistant", "content": text}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self.logprobs(logprobs),
            "finish_reason": finish,
        }
        return {**self._envelope(rid, created, "chat.completion", [choice]), "usage": usage}

    def usage_chunk(self, rid: str, created: int, usage: dict) -> dict:
        return {**self._envelope(rid, created, "chat.completion.chunk", []), "usage": usage}

    def logprobs(self, logprobs: list[TokenLogprob] | None) -> dict | None:
        if logprobs is None:
            return None

        def entry(token_id: int, logprob: float) -> dict:
            text = self._text(token_id)
            raw = text.encode() if self.tokenizer is None else self.tokenizer.token_bytes(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(raw)}

        content = [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
            for lp in logprobs
        ]
        return {"content": content, "refusal": None}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _respond(
    state: ServerState,
    raw: Request,
    req,
    fmt: _CompletionFormat,
    prompt_ids: list[int],
    params: SamplingParams,
) -> Response:
    request_id = f"{fmt.id_prefix}-{uuid.uuid4().hex}"
    try:
        stream = await state.client.add_request(request_id, prompt_ids, params, time.monotonic())
    except RequestRejectedError as e:
        state.metrics.observe_request_end("rejected", 0)
        if e.overloaded:
            raise APIError(
                str(e), 429, type="rate_limit_error", code="overloaded", headers={"Retry-After": "1"}
            ) from e
        if e.internal:
            raise _internal_error(str(e)) from e
        raise APIError(str(e), param=_param_of(str(e))) from e
    except EngineDeadError as e:
        raise APIError(str(e), 503, type="server_error", code="engine_dead") from e
    created = int(time.time())
    if req.stream:
        events = _stream_events(state, raw, req, fmt, stream, request_id, created, len(prompt_ids))
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    text, finish, num_output = [], None, 0
    logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
    try:
        async for delta in _deltas(state, raw, stream, len(prompt_ids)):
            if delta.error is not None:
                raise _internal_error(delta.error)
            text.append(delta.new_text)
            finish, num_output = delta.finish_reason, delta.num_output_tokens
            if logprobs is not None:
                logprobs.extend(delta.new_logprobs or ())
    except EngineDeadError as e:
        raise APIError(str(e), 503, type="server_error", code="engine_dead") from e
    if finish is None:  # the client went away; nobody reads this
        return Response(status_code=499)
    usage = _usage(len(prompt_ids), num_output)
    body = fmt.final(request_id, created, "".join(text), finish, logprobs, usage)
    return JSONResponse(body)


async def _deltas(
    state: ServerState, raw: Request, stream: RequestStream, num_prompt_tokens: int
) -> AsyncIterator[RequestOutput]:
    """A request's deltas; aborts it in the engine if the client disconnects or the consumer stops early."""
    checked = time.monotonic()
    try:
        while not stream.finished:
            delta = await stream.next(timeout=_DISCONNECT_POLL_S)
            # Checked while tokens flow too: a non-streaming client that left is only seen this way.
            if delta is None or time.monotonic() - checked >= _DISCONNECT_POLL_S:
                checked = time.monotonic()
                if await raw.is_disconnected():
                    return
            if delta is None:
                continue
            if delta.finished:
                state.metrics.observe_request_end(delta.finish_reason, num_prompt_tokens, delta.metrics)
            yield delta
    except EngineDeadError:
        state.metrics.observe_request_end("error", num_prompt_tokens)
        raise
    finally:
        if not stream.finished:
            state.metrics.observe_request_end("abort", num_prompt_tokens)
            stream.close()


async def _stream_events(
    state: ServerState,
    raw: Request,
    req,
    fmt: _CompletionFormat,
    stream: RequestStream,
    request_id: str,
    created: int,
    num_prompt_tokens: int,
) -> AsyncIterator[str]:
    first = True
    deltas = _deltas(state, raw, stream, num_prompt_tokens)
    try:
        async for delta in deltas:
            if delta.error is not None:
                yield _sse(_internal_error(delta.error).body())
                break
            # One chunk per generated token, even when its text is held back (a partial character).
            chunk = fmt.chunk(request_id, created, delta, first)
            if req.continuous_usage:
                chunk["usage"] = _usage(num_prompt_tokens, delta.num_output_tokens)
            first = False
            yield _sse(chunk)
            if delta.finished and req.include_usage:
                yield _sse(
                    fmt.usage_chunk(request_id, created, _usage(num_prompt_tokens, delta.num_output_tokens))
                )
    except EngineDeadError as e:
        yield _sse(APIError(str(e), 503, type="server_error", code="engine_dead").body())
    finally:
        with contextlib.suppress(Exception):
            await deltas.aclose()
    yield "data: [DONE]\n\n"


def _internal_error(message: str) -> APIError:
    """A 500 for a request the engine failed (a server bug); other requests are unaffected."""
    return APIError(f"internal error: {message}", 500, type="internal_server_error", code="internal_error")


def _param_of(message: str) -> str | None:
    """The request field an engine rejection message names, if any."""
    for param in ("stop_token_ids", "prompt"):
        if param in message:
            return param
    return None


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
