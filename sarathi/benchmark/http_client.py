"""Streaming HTTP client: replays a workload against a live OpenAI-compatible completions server.

Each request is sent at its arrival time on its own connection (``POST /v1/completions`` with prompt token
ids, ``ignore_eos`` and ``stream``); every streamed chunk with a choice is one token, timed when the client
receives it. Scheduling delay, preemptions and per-iteration stats are not visible over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sarathi.benchmark.metrics_store import MetricsStore
from sarathi.benchmark.workload import BenchRequest

DONE = object()  # the ``data: [DONE]`` sentinel


class SSEParser:
    """Incremental parser of a Server-Sent Events byte stream into the JSON payloads of ``data:`` lines.

    ``feed(bytes)`` returns the complete events so far: decoded JSON objects, or ``DONE``.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list:
        self._buffer += data
        events = []
        while True:
            cut = self._buffer.find(b"\n")
            if cut < 0:
                return events
            line, self._buffer = self._buffer[:cut].rstrip(b"\r"), self._buffer[cut + 1 :]
            event = parse_sse_line(line)
            if event is not None:
                events.append(event)


def parse_sse_line(line: bytes):
    """One SSE line: a JSON payload, ``DONE``, or None for blank lines, comments and other fields."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return DONE
    if not payload:
        return None
    return json.loads(payload)


def iter_sse_events(chunks) -> Iterator:
    """Events of a stream given as byte chunks (split anywhere)."""
    parser = SSEParser()
    for chunk in chunks:
        yield from parser.feed(chunk)


@dataclass
class StreamResult:
    """What one streamed completion delivered: a receive time per token chunk and the final usage."""

    token_times: list[float]
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: str | None = None


class StreamCollector:
    """Turns the events of one completion stream into token times (one per chunk with a choice).

    Servers end a stream differently: ours (like vLLM) puts the finish reason on the last token's chunk
    and the usage in a chunk with no choices; llama.cpp's ``llama-server`` sends every token first, then a
    final chunk with empty text, the finish reason and the usage. That final chunk is no token: a chunk
    with empty text and a finish reason that takes the count past the usage's ``completion_tokens`` is
    dropped again.
    """

    def __init__(self) -> None:
        self.result = StreamResult(token_times=[])
        self.done = False
        self._last_finish_only = False  # the last counted chunk had empty text and a finish reason

    def on_event(self, event, now: float) -> None:
        if event is DONE:
            self.done = True
            return
        if "error" in event:
            self.result.error = str(event["error"])
            return
        choices = event.get("choices") or []
        if choices:
            # A chunk may carry empty text (a held-back partial UTF-8 character): still one token.
            self.result.token_times.append(now)
            reason = choices[0].get("finish_reason")
            if reason is not None:
                self.result.finish_reason = reason
            self._last_finish_only = reason is not None and not choices[0].get("text")
        usage = event.get("usage")
        if usage:
            self.result.completion_tokens = usage.get("completion_tokens")
            n = self.result.completion_tokens
            if self._last_finish_only and n is not None and len(self.result.token_times) == n + 1:
                self.result.token_times.pop()
                self._last_finish_only = False


async def fetch_model_name(client, url: str) -> str:
    """The first model id the server lists at ``GET /v1/models``."""
    response = await client.get(f"{url}/v1/models")
    response.raise_for_status()
    data = response.json().get("data") or []
    if not data:
        raise ValueError(f"{url}/v1/models lists no model")
    return data[0]["id"]


async def stream_completion(client, url: str, model: str, request: BenchRequest) -> StreamResult:
    body = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": request.num_output_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    collector, parser = StreamCollector(), SSEParser()
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            return StreamResult([], error=f"HTTP {response.status_code}: {text[:200]}")
        async for chunk in response.aiter_bytes():
            now = time.monotonic()
            for event in parser.feed(chunk):
                collector.on_event(event, now)
    return collector.result


async def _run_http(
    url: str,
    requests: Sequence[BenchRequest],
    store: MetricsStore,
    progress: bool,
    desc: str | None,
    warmup: bool,
) -> list[str]:
    import httpx

    url = url.rstrip("/")
    # No keep-alive: every request opens its own connection, as independent clients would.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    errors: list[str] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(requests), desc=desc, unit="req", leave=False)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        model = await fetch_model_name(client, url)
        if warmup and requests:
            # One small unrecorded request first, so the server's one-time costs stay out of the numbers.
            first = requests[0]
            probe = BenchRequest("warmup", 0.0, 0, 2, first.prompt_token_ids[:16])
            result = await stream_completion(client, url, model, probe)
            if result.error is not None:
                raise ValueError(f"the warm-up request failed: {result.error}")
        t0 = time.monotonic()

        async def one(r: BenchRequest) -> None:
            await asyncio.sleep(max(0.0, t0 + r.arrival_time - time.monotonic()))
            arrival = t0 + r.arrival_time
            store.on_arrival(r.request_id, arrival, r.num_prompt_tokens, r.num_output_tokens)
            try:
                result = await stream_completion(client, url, model, r)
            except httpx.HTTPError as e:
                result = StreamResult([], error=f"{type(e).__name__}: {e}")
            for t in result.token_times:
                store.on_token(r.request_id, t)
            if result.error is not None:
                errors.append(f"{r.request_id}: {result.error}")
            elif result.token_times:
                store.on_finish(r.request_id, result.token_times[-1], num_preemptions=None)
            if bar is not None:
                bar.update(1)

        try:
            await asyncio.gather(*(one(r) for r in requests))
        finally:
            if bar is not None:
                bar.close()
    return errors


def run_http(
    url: str,
    requests: Sequence[BenchRequest],
    store: MetricsStore | None = None,
    progress: bool = False,
    desc: str | None = None,
    warmup: bool = True,
) -> tuple[MetricsStore, list[str]]:
    """Replay ``requests`` against the server at ``url`` (after one unrecorded warm-up request unless
    ``warmup`` is False); return the store and one message per failed request."""
    if any(not r.prompt_token_ids for r in requests):
        raise ValueError("every request needs prompt token ids (generate the workload with a token space)")
    store = store if store is not None else MetricsStore()
    errors = asyncio.run(_run_http(url, requests, store, progress, desc, warmup))
    return store, errors
