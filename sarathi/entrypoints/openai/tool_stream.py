"""Tool calls streamed as the tokens come: the output text is scanned incrementally (each character once)
and turned into OpenAI ``tool_calls`` deltas, a call's header (id, name) as soon as its name is complete,
then its arguments' JSON text piece by piece.

"required" output is a JSON array of ``{"name", "parameters"}`` objects; "auto" (Hermes) output is free
text with ``<tool_call>{"name", "arguments"}</tool_call>`` blocks, whose text outside the tags streams as
content (a tail that may still become ``<tool_call>`` is held back until it is decided).
"""

from __future__ import annotations

import json
import uuid

_OPEN_TAG, _CLOSE_TAG = "<tool_call>", "</tool_call>"
_WHITESPACE = " \t\r\n"


class _Value:
    """One JSON value, character by character: its raw text and whether it is complete."""

    def __init__(self) -> None:
        self.raw: list[str] = []
        self.depth = 0
        self.in_string = self.escaped = False
        self.complete = False

    def feed(self, c: str) -> bool:
        """Take ``c``; False when ``c`` is not part of the value (a number or literal ended before it)."""
        if self.in_string:
            self.raw.append(c)
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
                self.complete = self.depth == 0
            return True
        if self.depth == 0 and self.raw and c in ",}]" + _WHITESPACE:
            self.complete = True  # a number, true, false or null ended
            return False
        self.raw.append(c)
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            self.complete = self.depth == 0
        return True

    @property
    def text(self) -> str:
        return "".join(self.raw)


class _CallObject:
    """One ``{"name": ..., "<arguments key>": {...}}`` object, fed after its opening brace."""

    def __init__(self, arguments_keys: tuple[str, ...]) -> None:
        self.arguments_keys = arguments_keys
        self.name: str | None = None
        self.arguments: _Value | None = None
        self.done = False
        self._key: _Value | None = None
        self._key_text: str | None = None
        self._value: _Value | None = None
        self._expect = "key"  # "key" -> "colon" -> "value" -> "comma"

    def feed(self, c: str) -> None:
        if self._value is not None:
            if self._value.feed(c):
                if self._value.complete:
                    self._end_value()
                return
            self._end_value()  # c ended a literal: read it at this level
        if self._key is not None:
            self._key.feed(c)
            if self._key.complete:
                self._key_text, self._key, self._expect = _loads(self._key.text), None, "colon"
            return
        if c in _WHITESPACE:
            return
        if c == "}":
            self.done = True
        elif self._expect == "key" and c == '"':
            self._key = _Value()
            self._key.feed(c)
        elif self._expect == "colon" and c == ":":
            self._expect = "value"
        elif self._expect == "value":
            self._value = _Value()
            if self._key_text in self.arguments_keys and self.arguments is None:
                self.arguments = self._value
            self._value.feed(c)
            if self._value.complete:
                self._end_value()
        elif c == ",":
            self._expect = "key"

    def _end_value(self) -> None:
        value, self._value, self._expect = self._value, None, "comma"
        if self._key_text == "name" and self.name is None:
            name = _loads(value.text)
            self.name = name if isinstance(name, str) else None


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


class ToolCallStream:
    """Feeds one choice's output text; ``feed`` returns (content to send, ``tool_calls`` deltas)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.arguments_keys = ("parameters",) if mode == "required" else ("arguments", "parameters")
        self._calls: list[_CallObject] = []
        self._sent_args: list[int] = []
        self._current: _CallObject | None = None
        self._held = ""  # "auto": text that may be the start of a tag
        self._state = "content"  # "auto": content, before_object, object, after_object

    @property
    def num_calls(self) -> int:
        return sum(1 for call in self._calls if call.name is not None)

    def feed(self, text: str, finished: bool = False) -> tuple[str, list[dict]]:
        content = self._feed_required(text) if self.mode == "required" else self._feed_auto(text, finished)
        return content, self._deltas()

    def _feed_required(self, text: str) -> str:
        for c in text:
            if self._current is not None:
                self._current.feed(c)
                if self._current.done:
                    self._current = None
            elif c == "{":
                self._start_call()
        return ""

    def _feed_auto(self, text: str, finished: bool) -> str:
        content: list[str] = []
        pending, self._held = self._held + text, ""
        i = 0
        while i < len(pending):
            if self._state == "content":
                start = pending.find(_OPEN_TAG, i)
                if start == -1:
                    keep = 0 if finished else _partial_suffix(pending, _OPEN_TAG, i)
                    content.append(pending[i : len(pending) - keep])
                    self._held = pending[len(pending) - keep :]
                    break
                content.append(pending[i:start])
                i, self._state = start + len(_OPEN_TAG), "before_object"
            elif self._state == "object":
                self._current.feed(pending[i])
                i += 1
                if self._current.done:
                    self._current, self._state = None, "after_object"
            else:  # inside the tags, outside the call's object: look for the object or the closing tag
                end = pending.find(_CLOSE_TAG, i)
                brace = pending.find("{", i) if self._state == "before_object" else -1
                if brace != -1 and (end == -1 or brace < end):
                    self._start_call()
                    i, self._state = brace + 1, "object"
                elif end != -1:
                    i, self._state = end + len(_CLOSE_TAG), "content"
                else:
                    keep = 0 if finished else _partial_suffix(pending, _CLOSE_TAG, i)
                    self._held = pending[len(pending) - keep :]
                    break
        return "".join(content)

    def _start_call(self) -> None:
        self._current = _CallObject(self.arguments_keys)
        self._calls.append(self._current)
        self._sent_args.append(-1)  # -1: header not sent yet

    def _deltas(self) -> list[dict]:
        deltas = []
        index = 0
        for k, call in enumerate(self._calls):
            if call.name is None:
                continue
            args = call.arguments.text if call.arguments is not None else ""
            sent = self._sent_args[k]
            if sent == -1:
                deltas.append(
                    {
                        "index": index,
                        "id": f"call_{uuid.uuid4().hex[:24]}",
                        "type": "function",
                        "function": {"name": call.name, "arguments": args},
                    }
                )
                self._sent_args[k] = len(args)
            elif len(args) > sent:
                deltas.append({"index": index, "function": {"arguments": args[sent:]}})
                self._sent_args[k] = len(args)
            index += 1
        return deltas


def complete_calls(text: str) -> list[tuple[str, str]]:
    """(name, arguments JSON) of every complete call object of a "required" array, which may be cut off
    after them (an output that ran into ``max_tokens``)."""
    stream = ToolCallStream("required")
    stream.feed(text)
    out = []
    for call in stream._calls:
        if not (call.done and call.name is not None and call.arguments is not None):
            continue
        arguments = _loads(call.arguments.text)
        if isinstance(arguments, dict):
            out.append((call.name, json.dumps(arguments, ensure_ascii=False)))
    return out


def _partial_suffix(text: str, tag: str, start: int) -> int:
    """Length of the longest tail of ``text[start:]`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
