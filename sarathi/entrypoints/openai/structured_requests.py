"""A request's structured-output fields (OpenAI's ``response_format``, vLLM's ``guided_*`` and
``structured_outputs``) as one ``StructuredOutput``, held to the server's bounds by the input processor and
compiled in the constraint checker's helper process (``check_constraints``), so that a bad one is a 400
naming the field before the engine ever sees it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from sarathi.engine.input_processor import constraint_refused
from sarathi.entrypoints.openai.constraint_checker import ConstraintChecker
from sarathi.entrypoints.openai.errors import APIError
from sarathi.structured_output import (
    ANY_JSON_OBJECT,
    ConstraintError,
    StructuredOutput,
)

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_SO_KEYS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def structured_output_of(req: Any) -> StructuredOutput | None:
    """The one constraint ``req`` asks for (None: free text); APIError naming the field if it asks for
    several, or for one that is malformed. Its bounds are the input processor's; whether it compiles is
    ``check_constraints``'."""
    found: list[tuple[str, StructuredOutput]] = []
    for name in GUIDED_FIELDS:
        value = getattr(req, name, None)
        if value is not None:
            found.append((name, _guided(name, name.removeprefix("guided_"), value)))
    if (so := getattr(req, "structured_outputs", None)) is not None:
        found.extend(_structured_outputs(so))
    if (rf := getattr(req, "response_format", None)) is not None and (got := _response_format(rf)):
        found.append(got)
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise APIError(
            f"{found[1][0]}: only one structured output constraint at a time; got {names}", param=found[1][0]
        )
    if not found:
        return None
    param, constraint = found[0]
    return dataclasses.replace(constraint, source=param)


async def check_constraints(
    checker: ConstraintChecker | None, constraints: Iterable[StructuredOutput]
) -> None:
    """Compile each distinct constraint in the checker's helper process; InvalidRequestError naming the
    field of the first that fails. Never blocks the event loop."""
    if checker is None:
        return
    for constraint in dict.fromkeys(constraints):
        try:
            await checker.check(constraint)
        except ConstraintError as e:
            raise constraint_refused(constraint, e) from None


def _guided(param: str, kind: str, value: Any) -> StructuredOutput:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise APIError(f"{param}: not valid JSON: {e}", param=param) from None
        if not isinstance(value, dict | bool):
            raise APIError(f"{param}: a JSON schema must be an object", param=param)
        return StructuredOutput.json_schema(value)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise APIError(f"{param}: must be a non-empty list of strings", param=param)
        return StructuredOutput.choice(value)
    if not isinstance(value, str) or not value:
        raise APIError(f"{param}: must be a non-empty string", param=param)
    return StructuredOutput(kind, value)


def _structured_outputs(value: Any) -> list[tuple[str, StructuredOutput]]:
    """vLLM's newer ``structured_outputs``: {json | regex | choice | grammar | json_object}."""
    if not isinstance(value, dict):
        raise APIError("structured_outputs: must be an object", param="structured_outputs")
    found = []
    for key, kind in _SO_KEYS.items():
        if value.get(key) is not None:
            param = f"structured_outputs.{key}"
            found.append((param, _guided(param, kind, value[key])))
    if value.get("json_object"):
        found.append(("structured_outputs.json_object", StructuredOutput("json", ANY_JSON_OBJECT)))
    unknown = sorted(k for k, v in value.items() if v is not None and k not in (*_SO_KEYS, "json_object"))
    if unknown:
        param = f"structured_outputs.{unknown[0]}"
        raise APIError(f"{param}: not supported", param=param, code="unsupported")
    return found


def _response_format(value: Any) -> tuple[str, StructuredOutput] | None:
    kind = value.get("type", "text") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "response_format", StructuredOutput("json", ANY_JSON_OBJECT)
    if kind == "json_schema":
        param = "response_format.json_schema"
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise APIError(f"{param}: must be an object with a 'schema'", param=param)
        schema = spec.get("schema", {"type": "object"})
        return f"{param}.schema", _guided(f"{param}.schema", "json", schema)
    raise APIError(
        f"response_format: type must be 'text', 'json_object' or 'json_schema', got {value!r}"[:200],
        param="response_format",
    )
