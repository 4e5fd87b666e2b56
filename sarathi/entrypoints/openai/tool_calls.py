"""Tool calling for chat: which tools a request offers, how the model is told about them, what constrains
its output, and how calls are read back out of the text.

SmolLM2's chat template knows nothing of tools, so the tool definitions go into the system message in the
Hermes style (JSON signatures inside ``<tools>``, calls as ``<tool_call>{"name", "arguments"}</tool_call>``)
for every model. ``tool_choice``:

- ``"none"``: the tools are not shown and nothing is parsed.
- ``"auto"`` (the default when tools are given): on by default (``--no-enable-auto-tool-choice`` turns
  it off); the output is free and the parser (``choose_tool_parser``: from the model's chat template, or
  ``--tool-call-parser``) reads calls out of it.
- ``"required"``: the output is constrained to a JSON array of ``{"name", "parameters"}`` objects, one of
  the tools each, with that tool's parameter schema.
- a named function: the output is constrained to that function's parameter schema and is its arguments.

``parallel_tool_calls: false`` allows exactly one call: "required"'s array has one item, and "auto" output
ends at the first ``</tool_call>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sarathi.entrypoints.openai.errors import APIError
from sarathi.structured_output import StructuredOutput

if TYPE_CHECKING:
    from sarathi.entrypoints.openai.protocol import ChatMessage

TOOL_CALL_PARSERS = ("hermes",)
_HERMES_CLOSE = "</tool_call>"
_ANY_PARAMETERS = {"type": "object"}
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolFunction:
    """One function a request offers the model."""

    name: str
    description: str
    parameters: dict

    def signature(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    """A call read from the output: the function's name and its arguments as JSON text."""

    name: str
    arguments: str

    def as_json(self, index: int | None = None) -> dict:
        call = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses its tools: ``mode`` and, for "named", which function."""

    mode: Literal["auto", "required", "named"]
    functions: tuple[ToolFunction, ...]
    named: str | None = None
    parallel: bool = True  # False: at most one call (parallel_tool_calls: false)

    def system_prompt(self) -> str:
        signatures = "\n".join(json.dumps(f.signature(), ensure_ascii=False) for f in self.functions)
        return (
            "You can call functions to answer the user. Their signatures are in <tools></tools>:\n"
            f"<tools>\n{signatures}\n</tools>\n"
            "To call a function, write one JSON object with its name and arguments between "
            "<tool_call></tool_call> tags per call:\n"
            '<tool_call>\n{"name": <function name>, "arguments": <arguments object>}\n</tool_call>'
        )

    def constraint(self) -> StructuredOutput | None:
        """The grammar that enforces "required" and named choices (None for "auto")."""
        if self.mode == "named":
            return StructuredOutput.json_schema(self._function(self.named).parameters)
        if self.mode == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {"name": {"const": f.name}, "parameters": f.parameters},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for f in self.functions
            ]
            array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
            if not self.parallel:
                array["maxItems"] = 1
            return StructuredOutput.json_schema(array)
        return None

    def parameter_constraints(self) -> list[StructuredOutput]:
        """The parameter schema of each function the output is constrained to, named by its field
        (``tools.<i>.function.parameters``): checked one by one, a schema that does not compile is an
        error naming its tool, not the whole ``tools``."""
        return [
            dataclasses.replace(
                StructuredOutput.json_schema(f.parameters), source=f"tools.{i}.function.parameters"
            )
            for i, f in enumerate(self.functions)
            if self.mode == "required" or (self.mode == "named" and f.name == self.named)
        ]

    def stop_strings(self) -> tuple[str, ...]:
        """Extra stop strings: a single "auto" call ends the output (the text after it would be dropped)."""
        return (_HERMES_CLOSE,) if self.mode == "auto" and not self.parallel else ()

    def parse(self, text: str, cut: bool = False) -> tuple[str | None, list[ToolCall]]:
        """The output's remaining content (None if nothing is left) and the calls it makes. Output
        ``cut`` off by ``max_tokens`` gives the calls completed before the cut, and an "auto" call cut
        midway is dropped from the content (streaming sent it as a call, not as text)."""
        if self.mode == "named":
            return None, [ToolCall(self.named, text)]
        if self.mode == "required":
            try:
                items = json.loads(text)
                calls = [ToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in items]
            except (ValueError, TypeError, KeyError):
                from sarathi.entrypoints.openai.tool_stream import complete_calls  # it imports ToolCall

                calls = [ToolCall(name, arguments) for name, arguments in complete_calls(text)]
                return (None, calls) if calls else (text, [])
            return None, calls
        if cut and (start := text.rfind("<tool_call>")) != -1 and _HERMES_CLOSE not in text[start:]:
            content, calls = _parse_hermes(text[:start])
            if not calls:
                content = text[:start].strip() or None
        else:
            content, calls = _parse_hermes(text)
        return content, calls if self.parallel else calls[:1]

    def _function(self, name: str | None) -> ToolFunction:
        return next(f for f in self.functions if f.name == name)


def _parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    calls, kept, last = [], [], 0
    for match in _HERMES_CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
            call = ToolCall(body["name"], json.dumps(body.get("arguments", {}), ensure_ascii=False))
            if not isinstance(call.name, str):
                raise TypeError
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # not a well-formed call: it stays in the content
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls


def choose_tool_parser(chat_template: str | None) -> tuple[str, str]:
    """The parser for "auto" tool calls of a model with this chat template, and why."""
    if chat_template and "<tool_call>" in chat_template:
        return "hermes", "its chat template writes Hermes <tool_call> tags"
    if chat_template and "tools" in chat_template:
        return "hermes", "its chat template's tool format has no parser here; tools are prompted Hermes-style"
    return "hermes", "its chat template has no tool format; tools are prompted Hermes-style"


def plan_tools(
    tools: Any, tool_choice: Any, parser: str | None, auto_enabled: bool, parallel: bool = True
) -> ToolPlan | None:
    """The request's ``ToolPlan`` (None: no tools in play); APIError naming the field otherwise.
    ``parallel``: False allows exactly one call (``parallel_tool_calls: false``)."""
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if not tools or tool_choice == "none":
        if tool_choice not in ("none", "auto") and not tools:
            raise APIError("tool_choice: no tools were given", param="tool_choice")
        return None
    functions = _functions(tools)
    if tool_choice == "auto":
        if not (auto_enabled and parser):
            raise APIError(
                'tool_choice: "auto" is turned off on this server (--no-enable-auto-tool-choice); use '
                '"required" or a named function',
                param="tool_choice",
            )
        return ToolPlan("auto", functions, parallel=parallel)
    if tool_choice == "required":
        return ToolPlan("required", functions, parallel=parallel)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if (
        not isinstance(tool_choice, dict)
        or tool_choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise APIError(
            "tool_choice: must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if name not in {f.name for f in functions}:
        raise APIError(f"tool_choice: no tool is named {name!r}", param="tool_choice.function.name")
    return ToolPlan("named", functions, name)


def _functions(tools: Any) -> tuple[ToolFunction, ...]:
    if not isinstance(tools, list):
        raise APIError("tools: must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        param = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise APIError(
                f"{param}: only {{'type': 'function', 'function': ...}} tools", param=f"{param}.type"
            )
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise APIError(f"{param}.function.name: a function needs a name", param=f"{param}.function.name")
        parameters = fn.get("parameters") or _ANY_PARAMETERS
        if not isinstance(parameters, dict):
            raise APIError(
                f"{param}.function.parameters: must be a JSON schema object",
                param=f"{param}.function.parameters",
            )
        out.append(ToolFunction(fn["name"], str(fn.get("description") or ""), parameters))
    if len({f.name for f in out}) != len(out):
        raise APIError("tools: two tools have the same name", param="tools")
    return tuple(out)


def with_tool_prompt(turns: list[dict], plan: ToolPlan) -> list[dict]:
    """The conversation with the tool definitions in its system message (added if there is none)."""
    prompt = plan.system_prompt()
    if turns and turns[0]["role"] in ("system", "developer"):
        return [{"role": "system", "content": f"{turns[0]['content']}\n\n{prompt}"}, *turns[1:]]
    return [{"role": "system", "content": prompt}, *turns]


def render_assistant_calls(tool_calls: list[Any]) -> str:
    """An assistant message's earlier ``tool_calls`` as the Hermes text the model would have written."""
    parts = []
    for call in tool_calls:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = fn.get("arguments", "{}")
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        body = json.dumps({"name": fn.get("name"), "arguments": arguments}, ensure_ascii=False)
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(parts)


def conversation(messages: list[ChatMessage]) -> list[dict]:
    """Messages as plain dicts for the chat template; a non-text part is an APIError naming it. An
    assistant's earlier tool calls and tool answers are written in the Hermes style."""
    out = []
    for i, m in enumerate(messages):
        try:
            text = m.text()
        except ValueError as e:
            raise APIError(f"messages.{i}.content: {e}", param=f"messages.{i}.content") from e
        if m.role == "assistant" and m.tool_calls:
            text = "\n".join(t for t in (text, render_assistant_calls(m.tool_calls)) if t)
        elif m.role == "tool":
            text = f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": m.role, "content": text})
    return out
