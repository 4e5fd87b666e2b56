"""Structured outputs: the constraint a request puts on its output, as plain data, and its grammar.

A ``StructuredOutput`` (kind + spec string) travels inside ``SamplingParams`` to the worker that samples;
there it becomes an llguidance grammar (``to_grammar``) and a matcher per request
(``sarathi/worker/grammar_masks.py``). The API process checks a request's constraint with ``validate``
before it reaches the engine, so a bad schema or regex is a 400 naming the field, never a failed request.

llguidance is imported lazily: code that never meets a constraint never loads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

Kind = Literal["json", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json", "regex", "choice", "grammar")

# JSON without free whitespace: a small model given the choice tends to emit runs of spaces or newlines.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must match: ``kind`` "json" (``spec``: a JSON schema as text), "regex"
    (a regular expression), "choice" (a JSON list of strings: exactly one of them) or "grammar" (a
    Lark grammar in llguidance's dialect, or GBNF)."""

    kind: Kind
    spec: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.spec, str):
            raise ValueError(f"structured output spec must be a string, got {type(self.spec).__name__}")

    @staticmethod
    def json_schema(schema: dict | bool | str) -> StructuredOutput:
        """A JSON schema given as a dict (or its text)."""
        return StructuredOutput("json", schema if isinstance(schema, str) else json.dumps(schema))

    @staticmethod
    def choice(choices: list[str]) -> StructuredOutput:
        return StructuredOutput("choice", json.dumps(list(choices)))


def to_grammar(constraint: StructuredOutput) -> str:
    """The llguidance grammar (its serialized form) for ``constraint``; ValueError if the spec is not
    even well-formed (e.g. a schema that is not JSON). Whether the grammar compiles is ``validate``'s."""
    from llguidance import LLMatcher

    if constraint.kind == "json":
        try:
            schema = json.loads(constraint.spec)
        except ValueError as e:
            raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict | bool):
            raise ValueError("a JSON schema must be an object or a boolean")
        return LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=dict(_JSON_OPTIONS))
    if constraint.kind == "regex":
        return LLMatcher.grammar_from_regex(constraint.spec)
    if constraint.kind == "choice":
        choices = json.loads(constraint.spec)
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError("choices must be a non-empty list of strings")
        # Lark string literals take JSON escapes, so each choice is matched literally.
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(constraint.spec)  # GBNF (``root ::= ...``, as llama.cpp and vLLM take) or Lark
    except Exception as e:  # the converter raises its own error type
        raise ValueError(f"the grammar does not parse: {e}") from None
    return LLMatcher.grammar_from_lark(lark)


def validate(constraint: StructuredOutput) -> None:
    """Raise ValueError with the grammar library's message if ``constraint`` cannot be compiled."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(to_grammar(constraint))
    if is_error:
        raise ValueError(messages[0] if messages else "the grammar does not compile")
