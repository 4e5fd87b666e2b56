"""The JSON shapes of ``POST /v1/responses``: a Response object with its output items (an assistant
message, function calls) and usage, whole or as the stream of typed events the openai SDK parses.

Stream: ``response.created``, ``response.in_progress``; per output item ``response.output_item.added``,
then for a message ``response.content_part.added``, ``response.output_text.delta``\\*,
``response.output_text.done``, ``response.content_part.done``, and for a function call
``response.function_call_arguments.delta``\\*, ``response.function_call_arguments.done``; then
``response.output_item.done``; last ``response.completed`` (``response.incomplete`` when
``max_output_tokens`` cut the output). Every event has a ``sequence_number``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sarathi.entrypoints.openai.choices import ChoiceResult
from sarathi.entrypoints.openai.tool_calls import ToolPlan
from sarathi.entrypoints.openai.tool_stream import ToolCallStream
from sarathi.outputs import RequestOutput


def response_usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    """``usage`` in the Responses shape."""
    return {
        "input_tokens": input_tokens,
        # Nothing is written to a cache on request (the prefix cache fills itself): no cache writes.
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    """An assistant message output item with one ``output_text`` part."""
    content = [] if status == "in_progress" else [_text_part(text)]
    return {
        "id": item_id or _id("msg"),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def call_item(name: str, arguments: str, call_id: str | None = None, item_id: str | None = None) -> dict:
    """A ``function_call`` output item; ``call_id`` is what the client's ``function_call_output`` names."""
    return {
        "id": item_id or _id("fc"),
        "type": "function_call",
        "call_id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


@dataclass
class ResponseFormat:
    """One response's identity and echoed request fields; builds its Response objects."""

    response_id: str
    created: int
    model: str
    echoed: dict
    plan: ToolPlan | None

    def response(
        self, status: str, output: list[dict], usage: dict | None, finish_reason: str | None = None
    ) -> dict:
        incomplete = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": "incomplete" if incomplete else status,
            "output": output,
            "usage": usage,
            "error": None,
            "incomplete_details": incomplete,
            **self.echoed,
        }

    def final(self, result: ChoiceResult) -> dict:
        """The whole Response of a finished request (calls completed before a cut-off included)."""
        content, calls = result.text, []
        if self.plan is not None:
            content, calls = self.plan.parse(result.text, cut=result.finish_reason == "length")
        status = "incomplete" if result.finish_reason == "length" else "completed"
        output = []
        if content or not calls:
            output.append(message_item(content or "", status))
        output.extend(call_item(c.name, c.arguments) for c in calls)
        usage = response_usage(result.num_prompt_tokens, result.num_output_tokens, result.num_cached_tokens)
        return self.response("completed", output, usage, result.finish_reason)


@dataclass
class _OpenItem:
    """An output item being streamed: its index in ``output`` and the text streamed into it."""

    index: int
    kind: str  # "message" or "function_call"
    text: list[str] = field(default_factory=list)


class ResponseEvents:
    """Turns a request's deltas into Responses stream events (``start``, ``feed`` per delta)."""

    def __init__(self, fmt: ResponseFormat) -> None:
        self.fmt = fmt
        self.output: list[dict] = []
        self._seq = 0
        self._open: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}  # tool-call index -> its item
        self._tools = (
            ToolCallStream(fmt.plan.mode) if fmt.plan is not None and fmt.plan.mode != "named" else None
        )
        self._blank = ""  # whitespace held back until it is known not to be the only text

    def event(self, kind: str, **fields) -> dict:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    def start(self) -> list[dict]:
        snapshot = self.fmt.response("in_progress", [], None)
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def feed(self, delta: RequestOutput) -> list[dict]:
        """The events of one delta; the closing ones (and the final Response) with the last delta."""
        events: list[dict] = []
        finished = delta.finish_reason is not None
        if self.fmt.plan is None:
            self._add_text(delta.new_text, events)
        elif self._tools is None:  # a named function: the output is its arguments
            if not self._calls:
                self._open_call(0, self.fmt.plan.named, None, events)
            self._add_arguments(0, delta.new_text, events)
        else:
            text, calls = self._tools.feed(delta.new_text, finished=finished)
            self._add_text(text, events)
            for call in calls:
                if "id" in call:
                    self._open_call(call["index"], call["function"]["name"], call["id"], events)
                self._add_arguments(call["index"], call["function"].get("arguments", ""), events)
        if finished:
            events.extend(self._finish(delta))
        return events

    def _add_text(self, text: str, events: list[dict]) -> None:
        if not text:
            return
        if self._open is None or self._open.kind != "message":
            # With tools, whitespace around calls does not open a message of its own.
            if self.fmt.plan is not None and not (self._blank + text).strip():
                self._blank += text
                return
            text, self._blank = self._blank + text, ""
            self._open_message(events)
        self._open.text.append(text)
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=self.output[self._open.index]["id"],
                output_index=self._open.index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )

    def _open_message(self, events: list[dict]) -> None:
        self._close(events)
        item = message_item("", "in_progress")
        self._open = _OpenItem(len(self.output), "message")
        self.output.append(item)
        events.append(self.event("response.output_item.added", output_index=self._open.index, item=item))
        events.append(
            self.event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self._open.index,
                content_index=0,
                part=_text_part(""),
            )
        )

    def _open_call(self, index: int, name: str, call_id: str | None, events: list[dict]) -> None:
        self._close(events)
        self._blank = ""
        item = {**call_item(name, "", call_id), "status": "in_progress"}
        self._open = self._calls[index] = _OpenItem(len(self.output), "function_call")
        self.output.append(item)
        events.append(self.event("response.output_item.added", output_index=self._open.index, item=item))

    def _add_arguments(self, index: int, text: str, events: list[dict]) -> None:
        call = self._calls.get(index)
        if call is None or not text:
            return
        call.text.append(text)
        events.append(
            self.event(
                "response.function_call_arguments.delta",
                item_id=self.output[call.index]["id"],
                output_index=call.index,
                delta=text,
            )
        )

    def _close(self, events: list[dict]) -> None:
        """End the open item: its done events, and the item as finished in ``output``."""
        item_state, self._open = self._open, None
        if item_state is None:
            return
        i, text = item_state.index, "".join(item_state.text)
        item = self.output[i]
        if item_state.kind == "message":
            part = _text_part(text)
            common = {"item_id": item["id"], "output_index": i, "content_index": 0}
            events.append(self.event("response.output_text.done", **common, text=text, logprobs=[]))
            events.append(self.event("response.content_part.done", **common, part=part))
            item = {**item, "status": "completed", "content": [part]}
        else:
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=i,
                    name=item["name"],
                    arguments=text,
                )
            )
            item = {**item, "arguments": text, "status": "completed"}
        self.output[i] = item
        events.append(self.event("response.output_item.done", output_index=i, item=item))

    def _finish(self, last: RequestOutput) -> list[dict]:
        events: list[dict] = []
        if not self.output:  # nothing was said: still one (empty) message, as the whole response has
            self._open_message(events)
        self._close(events)
        usage = response_usage(last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens)
        response = self.fmt.response("completed", self.output, usage, last.finish_reason)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        events.append(self.event(kind, response=response))
        return events
