"""The HTTP client: SSE parsing of canned completion streams, and a replay against a canned local server."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest

from sarathi.benchmark.http_client import (
    DONE,
    SSEParser,
    StreamCollector,
    iter_sse_events,
    parse_sse_line,
    run_http,
)
from sarathi.benchmark.workload import BenchRequest


def _chunk(text: str, finish: str | None = None) -> bytes:
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


STREAM = (
    _chunk("Hello")
    + _chunk("")  # a held-back partial UTF-8 character: still a token
    + b": keep-alive comment\n\n"
    + _chunk(" wor\xc3\xa9".encode("latin-1").decode("utf-8"))
    + _chunk("ld", "length")
    + b'data: {"id": "cmpl-1", "choices": [], '
    + b'"usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}}\r\n\r\n'
    + b"data: [DONE]\n\n"
)


def test_events_are_the_same_however_the_bytes_are_split():
    whole = list(iter_sse_events([STREAM]))
    for size in (1, 3, 17, 64):
        parts = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
        assert list(iter_sse_events(parts)) == whole
    assert len(whole) == 6 and whole[-1] is DONE
    assert [e["choices"][0]["text"] for e in whole[:4]] == ["Hello", "", " woré", "ld"]


def test_collector_counts_every_choice_chunk_as_a_token():
    collector = StreamCollector()
    for i, event in enumerate(iter_sse_events([STREAM])):
        collector.on_event(event, now=float(i))
    r = collector.result
    assert r.token_times == [0.0, 1.0, 2.0, 3.0]
    assert r.finish_reason == "length" and r.completion_tokens == 4 and r.error is None
    assert collector.done


def _llama_server_chunk(text: str, finish: str | None = None, usage: dict | None = None) -> bytes:
    body = {
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        "object": "text_completion",
        "id": "chatcmpl-1",
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


# llama.cpp's llama-server (/v1/completions, stream): one chunk per token, then a final chunk with empty
# text, the finish reason and the usage, then [DONE].
LLAMA_SERVER_STREAM = (
    _llama_server_chunk("Hello")
    + _llama_server_chunk(" wor")
    + _llama_server_chunk("ld")
    + _llama_server_chunk("", "length", {"completion_tokens": 3, "prompt_tokens": 5, "total_tokens": 8})
    + b"data: [DONE]\n\n"
)


def test_collector_drops_llama_servers_final_chunk_that_is_no_token():
    collector = StreamCollector()
    for i, event in enumerate(iter_sse_events([LLAMA_SERVER_STREAM])):
        collector.on_event(event, now=float(i))
    r = collector.result
    assert r.token_times == [0.0, 1.0, 2.0]
    assert r.finish_reason == "length" and r.completion_tokens == 3 and collector.done


def test_collector_keeps_a_last_token_with_held_back_text():
    # Our server: the last token's chunk has empty text (a partial character) and the finish reason; the
    # usage follows in a chunk without choices and counts it.
    stream = (
        _chunk("a")
        + _chunk("", "length")
        + b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n'
        + b"data: [DONE]\n\n"
    )
    collector = StreamCollector()
    for i, event in enumerate(iter_sse_events([stream])):
        collector.on_event(event, now=float(i))
    assert collector.result.token_times == [0.0, 1.0]


def test_partial_line_is_held_until_its_newline():
    parser = SSEParser()
    assert parser.feed(b'data: {"choices": [') == []
    assert parser.feed(b"]}") == []
    assert parser.feed(b"\n") == [{"choices": []}]


def test_non_data_lines_are_ignored_and_errors_recorded():
    assert parse_sse_line(b"event: message") is None
    assert parse_sse_line(b"") is None
    assert parse_sse_line(b"data: [DONE]") is DONE
    collector = StreamCollector()
    collector.on_event({"error": {"message": "boom"}}, now=0.0)
    assert "boom" in collector.result.error and collector.result.token_times == []


class _CannedServer:
    """A tiny HTTP/1.1 server in a thread that streams ``max_tokens`` chunks per completion, one connection
    per request (it answers ``Connection: close``); it records the JSON bodies and counts connections."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.connections = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = int(
            next((h.split(":")[1] for h in head.split("\r\n") if h.lower().startswith("content-length")), 0)
        )
        body = json.loads(await reader.readexactly(length)) if length else None
        if head.startswith("GET /v1/models"):
            payload = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
        else:
            self.bodies.append(body)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            n = body["max_tokens"]
            for i in range(n):
                writer.write(_chunk("x" if i % 2 else "", "length" if i == n - 1 else None))
                await writer.drain()
                await asyncio.sleep(0.01)
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": 0}
            writer.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_run_http_streams_each_request_on_its_own_connection():
    server = _CannedServer()
    try:
        requests = [
            BenchRequest("req-0", 0.0, 3, 4, (11, 12, 13)),
            BenchRequest("req-1", 0.05, 2, 6, (21, 22)),
        ]
        store, errors = run_http(server.url, requests)
    finally:
        server.close()
    assert errors == []
    assert server.connections == 4  # GET /v1/models, the warm-up, one per completion
    warmup, *bodies = server.bodies
    assert warmup["prompt"] == [11, 12, 13] and warmup["max_tokens"] == 2 and "warmup" not in store.requests
    assert sorted(b["prompt"] for b in bodies) == [[11, 12, 13], [21, 22]]
    body = bodies[0]
    assert (body["model"], body["stream"], body["ignore_eos"], body["temperature"]) == ("tiny", True, True, 0)
    assert body["stream_options"] == {"include_usage": True}
    a, b = store.requests["req-0"], store.requests["req-1"]
    assert (a.num_output_tokens, b.num_output_tokens) == (4, 6)  # empty-text chunks count as tokens
    assert b.arrival_time - a.arrival_time == pytest.approx(0.05)
    assert all(g >= 0.005 for g in a.tbts) and a.ttft > 0 and a.finished and b.finished
    s = store.summary()
    assert (
        s["num_output_tokens"] == 10
        and s["num_preemptions"] is None
        and math.isnan(s["scheduling_delay_p50"])
    )
