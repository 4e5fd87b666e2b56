"""The request body of ``POST /v1/responses`` (OpenAI's Responses API) and its translation into what the chat
path already understands: input items as chat messages, flat function tools as chat tools, ``text.format``
as ``response_format``, ``max_output_tokens`` as ``max_tokens``.

Stateless, as vLLM's: nothing is stored, so ``previous_response_id``, ``store: true``, ``conversation`` and
``background`` are refused with a 400 naming the field (``refusals.RESPONSES``), and a conversation is
carried by sending its items again (``function_call`` / ``function_call_output`` included).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from pydantic import PrivateAttr

from sarathi.entrypoints.openai.errors import APIError
from sarathi.entrypoints.openai.protocol import ChatMessage, _SamplingRequest
from sarathi.sampling_params import InvalidRequestError

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(_SamplingRequest):
    """``POST /v1/responses``: ``input`` (a string or a list of items), ``instructions``, sampling, function
    ``tools``, ``text.format`` and ``stream``. vLLM's extra sampling fields are accepted as on chat."""

    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    # The chat shapes of tools and tool_choice, set by check_supported (not request fields).
    _chat_tools: list[dict] | None = PrivateAttr(default=None)
    _chat_tool_choice: Any = PrivateAttr(default=None)

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.input, str) and not self.input:
            raise APIError("input: the input is empty", param="input", code="empty_prompt")
        if isinstance(self.input, list) and not self.input:
            raise APIError("input: the input has no items", param="input", code="empty_prompt")
        # text.format as response_format (a body's own response_format is refused by the table).
        self.response_format = _response_format(self.text)
        self._chat_tools = _chat_tools(self.tools)
        self._chat_tool_choice = _chat_tool_choice(self.tool_choice)

    @property
    def chat_tools(self) -> list[dict] | None:
        """``tools`` in chat's shape."""
        return self._chat_tools

    @property
    def chat_tool_choice(self) -> Any:
        """``tool_choice`` in chat's shape."""
        return self._chat_tool_choice

    def messages(self) -> list[ChatMessage]:
        """``instructions`` and ``input`` as chat messages; APIError naming the item otherwise."""
        out = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            return [*out, ChatMessage(role="user", content=self.input)]
        for i, item in enumerate(self.input):
            out = _add_item(out, item, f"input.{i}")
        if not any(m.role != "system" for m in out):
            raise APIError("input: needs a message that is not a system message", param="input")
        return out

    def echoed(self) -> dict:
        """The request fields a Response object repeats."""
        tools = [
            {
                "type": "function",
                "name": t["function"]["name"],
                "description": t["function"].get("description"),
                "parameters": t["function"].get("parameters"),
                "strict": bool(t.get("strict", False)),
            }
            for t in self.chat_tools or ()
        ]
        fmt = (self.text or {}).get("format") or {"type": "text"}
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "tools": tools,
            "tool_choice": "auto" if self.tool_choice is None else self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "text": {"format": fmt},
            "metadata": self.metadata,
            "store": False,
            "background": False,
            "previous_response_id": None,
            "reasoning": None,
            "truncation": "disabled",
            "user": self.user,
        }


def _add_item(out: list[ChatMessage], item: Any, param: str) -> list[ChatMessage]:
    if not isinstance(item, dict):
        raise APIError(f"{param}: an input item must be an object", param=param)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = _ROLES.get(item.get("role"))
        if role is None:
            raise APIError(
                f"{param}.role: must be user, system, developer or assistant", param=f"{param}.role"
            )
        return [*out, ChatMessage(role=role, content=_text(item.get("content"), f"{param}.content"))]
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise APIError(f"{param}.{key}: must be a string", param=f"{param}.{key}")
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        last = out[-1] if out else None
        if last is not None and last.role == "assistant":  # the calls of one assistant turn stay together
            merged = last.model_copy(update={"tool_calls": [*(last.tool_calls or ()), call]})
            return [*out[:-1], merged]
        return [*out, ChatMessage(role="assistant", content=None, tool_calls=[call])]
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise APIError(f"{param}.call_id: must be a string", param=f"{param}.call_id")
        output = _text(item.get("output"), f"{param}.output")
        return [*out, ChatMessage(role="tool", content=output, tool_call_id=item["call_id"])]
    if kind == "reasoning":
        raise APIError(
            f"{param}.type: reasoning items are not supported", param=f"{param}.type", code="unsupported"
        )
    raise APIError(
        f"{param}.type: input items of type {kind!r} are not supported (message, function_call, "
        "function_call_output)",
        param=f"{param}.type",
        code="unsupported",
    )


def _text(content: Any, param: str) -> str:
    """A message's content (a string or a list of text parts) as one string."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(f"{param}: must be a string or a list of content parts", param=param)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        else:
            raise APIError(
                f"{param}.{j}.type: only text content parts are supported, got {kind!r}",
                param=f"{param}.{j}.type",
                code="unsupported",
            )
    return "".join(parts)


def _chat_tools(tools: list[Any] | None) -> list[dict] | None:
    """Flat Responses function tools as chat tools; hosted tools (web_search, file_search, ...) refused."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise APIError(
                f"tools.{i}.type: only function tools are supported, not {kind!r} (hosted tools run on "
                "OpenAI's servers)",
                param=f"tools.{i}.type",
                code="unsupported",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": fn, "strict": tool.get("strict")})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else None
    raise APIError(
        "tool_choice: must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}, "
        f"got {kind!r}",
        param="tool_choice",
        code="unsupported",
    )


def _response_format(text: dict[str, Any] | None) -> dict | None:
    """``text.format`` in chat's ``response_format`` shape."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError("text.format.schema: a JSON schema object is required", param="text.format.schema")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt["schema"]}}
    raise APIError(
        f"text.format.type: must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="text.format.type",
    )


# Chat's parameter names in errors raised by the shared checks, as the Responses API calls them.
_RENAMES = (
    (re.compile(r"^response_format\.json_schema"), "text.format"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^max_tokens"), "max_output_tokens"),
    (re.compile(r"^messages"), "input"),
    (re.compile(r"^tools\.(\d+)\.function\."), r"tools.\1."),
    (re.compile(r"^tool_choice\.function\."), "tool_choice."),
)


@contextlib.contextmanager
def responses_param_names() -> Iterator[None]:
    """Re-raise an error of the shared chat checks with the Responses API's field name."""
    try:
        yield
    except (APIError, InvalidRequestError) as e:
        if e.param:
            for pattern, name in _RENAMES:
                renamed = pattern.sub(name, e.param, count=1)
                if renamed != e.param:
                    e.message = e.message.replace(e.param, renamed, 1)
                    e.param = renamed
                    break
        raise
