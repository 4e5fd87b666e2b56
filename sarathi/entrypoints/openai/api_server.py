"""The FastAPI app: OpenAI-compatible completions and chat completions over an engine-core process.

Tokenization happens here; the engine core detokenizes (holding back partial UTF-8 characters and text
that may still turn into a stop string) so streamed text always equals the final text.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import sarathi
from sarathi.engine.core_client import EngineDeadError, RequestStream
from sarathi.entrypoints.openai import refusals
from sarathi.entrypoints.openai.choices import (
    ChoiceJob,
    ChoiceResult,
    PromptJob,
    echoed,
    echoed_delta,
    fan_out,
    pick_best,
)
from sarathi.entrypoints.openai.engine_requests import (
    collect,
    deltas,
    engine_dead,
    internal_error,
    request_error,
    sse,
    submit,
)
from sarathi.entrypoints.openai.errors import APIError, invalid_request
from sarathi.entrypoints.openai.guards import AccessPolicy, install_access_policy
from sarathi.entrypoints.openai.json_pieces import PiecewiseJSONResponse, sse_in_pieces
from sarathi.entrypoints.openai.openapi_docs import document_request_bodies
from sarathi.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sarathi.entrypoints.openai.request_checks import (
    check_model,
    encode_chat,
    encode_prompt,
    parse_request,
    sampling_params_for,
)
from sarathi.entrypoints.openai.response_formats import (
    ChatFormat,
    CompletionFormat,
    ToolChatFormat,
    usage,
)
from sarathi.entrypoints.openai.responses_api import add_responses_routes
from sarathi.entrypoints.openai.responses_protocol import ResponsesRequest
from sarathi.entrypoints.openai.server_state import ServerState
from sarathi.entrypoints.openai.structured_requests import check_constraints
from sarathi.entrypoints.openai.tokenize_api import DetokenizeRequest, TokenizeRequest, add_tokenize_routes
from sarathi.entrypoints.openai.tool_calls import plan_tools
from sarathi.entrypoints.openai.work_bounds import check_jobs_fit, num_batch_prompts
from sarathi.sampling_params import InvalidRequestError

__all__ = ["ServerState", "create_app"]


def create_app(state: ServerState, policy: AccessPolicy | None = None) -> FastAPI:
    """The app for an already started engine core (``state.client.ready`` is set)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if state.tokenizer is not None:  # the id -> text table of log probabilities, off the event loop
            await asyncio.to_thread(lambda: state.tokenizer.token_texts)
        if state.constraints is not None:
            await state.constraints.start()  # the helper loads the tokenizer before the first request
        gc.collect()  # the start-up heap out of the collector's sight, as in the engine core
        gc.freeze()
        yield
        # Runs once uvicorn has drained (or given up on) in-flight requests.
        if state.constraints is not None:
            await state.constraints.close()
        await state.client.shutdown()
        print("sarathi serve: engine core stopped", flush=True)

    app = FastAPI(title="sarathi", version=sarathi.__version__, lifespan=lifespan)
    app.state.sarathi = state
    state.client.on_outputs = state.metrics.observe_core_outputs
    policy = policy or AccessPolicy()
    install_access_policy(app, policy)
    document_request_bodies(
        app,
        {
            "/v1/completions": CompletionRequest,
            "/v1/chat/completions": ChatCompletionRequest,
            "/v1/responses": ResponsesRequest,
            "/tokenize": TokenizeRequest,
            "/detokenize": DetokenizeRequest,
        },
    )

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(InvalidRequestError)  # the input processor's and SamplingParams' refusals
    async def _invalid_request(raw: Request, e: InvalidRequestError) -> JSONResponse:
        return await _api_error(raw, invalid_request(e))

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        # A bug: still an OpenAI-style body, never a plain-text 500.
        return JSONResponse(internal_error(f"{type(e).__name__}: {e}").body(), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        # Keeps the exception's headers: a 405 names the allowed methods in Allow.
        return JSONResponse(
            APIError(str(e.detail), e.status_code, type=kind).body(),
            status_code=e.status_code,
            headers=e.headers,
        )

    @app.get("/health")
    async def health() -> dict:
        if not state.client.is_healthy:
            reason = state.client.dead_reason or "engine core is not responding"
            raise APIError(reason, 503, type="server_error", code="engine_dead")
        return {"status": "ok"}

    @app.get("/version")
    async def version() -> dict:
        return {"version": sarathi.__version__}

    @app.get("/server_info")
    async def server_info() -> Response:
        """The effective configuration (behind the API key): ``sarathi serve``'s start-up line, live."""
        info = state.effective_config(policy.api_key is not None)
        return Response(json.dumps(info, default=str), media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        state.metrics.in_flight.set(state.client.num_in_flight)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card() -> dict:
        return {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "sarathi",
            "max_model_len": state.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        check_model(state, model_id)
        return model_card()

    add_tokenize_routes(app, state)
    add_responses_routes(app, state)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        req = await parse_request(
            state,
            raw,
            CompletionRequest,
            refusals.COMPLETIONS,
            lambda body: state.limits.check_batch_prompts(num_batch_prompts(body.get("prompt"))),
        )
        check_model(state, req.model)
        jobs = []
        for prompt in req.prompts():
            prompt_ids = await encode_prompt(state, prompt)
            params = sampling_params_for(state, req, len(prompt_ids), req.max_tokens, "prompt")
            jobs.append(PromptJob(prompt_ids, params, _echo_text(state, prompt) if req.echo else None))
        fmt = CompletionFormat(state.model_name, state.tokenizer, req.prompt_logprobs is not None)
        return await _respond(state, raw, req, fmt, jobs)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        req = await parse_request(state, raw, ChatCompletionRequest, refusals.CHAT)
        check_model(state, req.model)
        tools = plan_tools(
            req.tools,
            req.tool_choice,
            state.tool_call_parser,
            state.enable_auto_tool_choice,
            parallel=req.parallel_tool_calls is not False,
        )
        if tools is not None:  # each enforced tool's schema alone first, so that an error names its tool
            schemas = [state.processor.check_constraint(c) for c in tools.parameter_constraints()]
            await check_constraints(state.constraints, schemas)
        prompt_ids = await encode_chat(state, req.messages, req.add_generation_prompt, tools=tools)
        params = sampling_params_for(state, req, len(prompt_ids), req.requested_max_tokens, "messages", tools)
        show_prompt_logprobs = req.prompt_logprobs is not None
        if tools is None:
            fmt = ChatFormat(state.model_name, state.tokenizer, show_prompt_logprobs)
        else:
            fmt = ToolChatFormat(state.model_name, state.tokenizer, tools, show_prompt_logprobs)
        return await _respond(state, raw, req, fmt, [PromptJob(prompt_ids, params)])

    return app


# --- responses -------------------------------------------------------------------------------------------


async def _respond(
    state: ServerState, raw: Request, req, fmt: CompletionFormat, jobs: list[PromptJob]
) -> Response:
    """Run every prompt's sequences (``n`` / ``best_of`` each) as engine requests and answer with one
    choice per returned sequence, prompt by prompt."""
    check_jobs_fit(jobs, state.client.ready.num_kv_blocks, state.client.ready.block_size)
    request_id = f"{fmt.id_prefix}-{uuid.uuid4().hex}"
    choices = fan_out(jobs)
    ids = [request_id] if len(choices) == 1 else [f"{request_id}-{i}" for i in range(len(choices))]
    submitted = await asyncio.gather(
        *(
            submit(
                state,
                rid,
                jobs[c.prompt].prompt_ids,
                c.params,
                None if c.after is None else ids[c.after],
            )
            for rid, c in zip(ids, choices, strict=True)
        ),
        return_exceptions=True,
    )
    if failed := [x for x in submitted if isinstance(x, BaseException)]:
        for stream in submitted:
            if isinstance(stream, RequestStream):
                stream.close()  # aborts the accepted ones
        raise failed[0]
    streams: list[RequestStream] = list(submitted)
    for job in jobs:
        state.metrics.observe_request_params(job.params)
    created = int(time.time())
    if req.stream:
        events = _stream_events(state, raw, req, fmt, streams, request_id, created, jobs, choices)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        async with asyncio.TaskGroup() as group:  # one failing choice cancels (aborts) the others
            tasks = [
                group.create_task(collect(state, raw, stream, len(jobs[c.prompt].prompt_ids), c.params))
                for stream, c in zip(streams, choices, strict=True)
            ]
    except* EngineDeadError as e:
        raise engine_dead(e.exceptions[0]) from None
    except* APIError as e:
        raise e.exceptions[0] from None
    results = [t.result() for t in tasks]
    if any(r is None for r in results):  # the client went away; nobody reads this
        return Response(status_code=499)
    kept = pick_best(jobs, choices, results)
    prompts_of_kept = [k for k, job in enumerate(jobs) for _ in range(job.params.n)]
    kept = [_with_echo(jobs[k], r) for k, r in zip(prompts_of_kept, kept, strict=True)]
    if any(r.logprobs or r.prompt_logprobs for r in kept):
        # Thousands of scored tokens take a while to shape and encode: a worker thread, encoding in small
        # pieces, so the event loop (other streams, /health) gets the GIL back every switch interval.
        return await asyncio.to_thread(lambda: PiecewiseJSONResponse(fmt.final(request_id, created, kept)))
    return JSONResponse(fmt.final(request_id, created, kept))


def _with_echo(job: PromptJob, result: ChoiceResult) -> ChoiceResult:
    text, logprobs = echoed(job, result.text, result.logprobs, result.prompt_logprobs)
    return dataclasses.replace(result, text=text, logprobs=logprobs)


def _echo_text(state: ServerState, prompt: str | list[int]) -> str:
    """The prompt as text, for ``echo``."""
    if isinstance(prompt, str):
        return prompt
    return "" if state.tokenizer is None else state.tokenizer.decode(prompt, skip_special_tokens=False)


async def _stream_events(
    state: ServerState,
    raw: Request,
    req,
    fmt: CompletionFormat,
    streams: list[RequestStream],
    request_id: str,
    created: int,
    jobs: list[PromptJob],
    choices: list[ChoiceJob],
) -> AsyncIterator[str]:
    """SSE events of every stream, interleaved as tokens come, each chunk's choice ``index`` naming its
    choice (prompt by prompt); the usage chunk (summed, each prompt counted once) once all have finished;
    then ``[DONE]``."""
    queue: asyncio.Queue = asyncio.Queue()
    prompt_lens = [len(jobs[c.prompt].prompt_ids) for c in choices]

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for delta in deltas(state, raw, stream, prompt_lens[index]):
                queue.put_nowait((index, delta))
        except EngineDeadError as e:
            queue.put_nowait((index, e))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    first, num_output, finished, open_streams = [True] * len(streams), [0] * len(streams), 0, len(streams)
    cached = [0] * len(streams)  # prefix-cache hits of each prompt's first choice (usage counts it once)
    try:
        while open_streams:
            index, item = await queue.get()
            if item is None:
                open_streams -= 1
                continue
            if isinstance(item, EngineDeadError):
                yield sse(engine_dead(item).body())
                break
            if item.error is not None:
                yield sse(request_error(item).body())
                break
            if first[index]:
                item = echoed_delta(jobs[choices[index].prompt], item)
            # One chunk per generated token, even when its text is held back (a partial character).
            big = bool(item.prompt_logprobs or (item.new_logprobs and len(item.new_logprobs) > 1))  # echo
            if big:
                chunk = await asyncio.to_thread(fmt.chunk, request_id, created, item, first[index], index)
            else:
                chunk = fmt.chunk(request_id, created, item, first[index], index)
            num_output[index] = item.num_output_tokens
            if choices[index].first_of_prompt:
                cached[index] = item.num_cached_tokens
            if req.continuous_usage:
                chunk["usage"] = usage(prompt_lens[index], item.num_output_tokens, item.num_cached_tokens)
            first[index] = False
            yield (await asyncio.to_thread(sse_in_pieces, chunk)) if big else sse(chunk)
            finished += item.finished
        if finished == len(streams) and req.include_usage:
            num_prompt = sum(len(job.prompt_ids) for job in jobs)
            total = usage(num_prompt, sum(num_output), sum(cached))
            yield sse(fmt.usage_chunk(request_id, created, total))
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
    yield "data: [DONE]\n\n"
