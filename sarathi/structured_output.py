"""Structured outputs: the constraint a request puts on its output, as plain data, and its grammar.

A ``StructuredOutput`` (kind + spec string) travels inside ``SamplingParams`` to the worker that samples;
there it becomes an llguidance grammar (``to_grammar``) and a matcher per request
(``sarathi/worker/grammar_masks.py``).

Constraints are untrusted input that a grammar library compiles, so where a request enters they are first
held to ``StructuredOutputLimits`` (``check_bounds``: sizes, rule counts, nesting; no library involved),
then compiled where a crash cannot take the server with it (``check_compiles`` run in a helper process by
the API server, see ``sarathi/entrypoints/openai/constraint_checker.py``). llguidance recurses on the
stack while compiling, so every compile runs on a thread with a large stack (``run_on_big_stack``).

llguidance is imported lazily: code that never meets a constraint never loads it.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Literal, TypeVar

from sarathi.config import knob

Kind = Literal["json", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json", "regex", "choice", "grammar")

# JSON without free whitespace: a small model given the choice tends to emit runs of spaces or newlines.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must match: ``kind`` "json" (``spec``: a JSON schema as text), "regex"
    (a regular expression), "choice" (a JSON list of strings: exactly one of them) or "grammar" (a
    Lark grammar in llguidance's dialect, or GBNF). ``source`` names the request field it came from, for
    error messages."""

    kind: Kind
    spec: str
    source: str = field(default="", compare=False)

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


# --- bounds ------------------------------------------------------------------------------------------------


class ConstraintError(ValueError):
    """A constraint the server refuses: over a bound, malformed, or failing to compile. The message is
    meant for the client (no library backtraces)."""


@dataclass(frozen=True)
class StructuredOutputLimits:
    """Bounds on one request's constraint, checked before any grammar library sees it.

    The defaults admit every real-world grammar and schema we know of with room to spare, and keep a
    compile well under a second on a 2-core CPU (a chain of 5,000 grammar rules overflows llguidance's stack;
    100,000 choices take a minute to compile)."""

    max_grammar_chars: int = knob(65_536, "characters of a guided grammar (Lark or GBNF)", type=int)
    max_grammar_rules: int = knob(1_000, "rule definitions in a guided grammar", type=int)
    max_schema_chars: int = knob(
        65_536, "characters of a JSON schema (response_format, guided_json, tools)", type=int
    )
    max_schema_depth: int = knob(32, "nesting depth of a JSON schema", type=int)
    max_choices: int = knob(1_024, "strings in a guided_choice", type=int)
    max_choice_chars: int = knob(1_024, "characters of one guided_choice string", type=int)
    max_regex_chars: int = knob(4_096, "characters of a guided regex", type=int)
    max_nesting: int = knob(64, "brackets nested inside a guided regex or grammar", type=int)
    compile_timeout_s: float = knob(
        10.0,
        "seconds a constraint may take to compile (in a helper process)",
        flags=("--structured-output-compile-timeout",),
        type=float,
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"--{f.name.replace('_', '-')} must be > 0, got {getattr(self, f.name)}")


# A rule definition at the start of a line: Lark ``name:``, ``?name:``, ``NAME.2:``, or GBNF ``name ::=``.
_RULE_DEFINITION = re.compile(r"^\s*[?!]?[A-Za-z_][\w-]*(\.-?\d+)?\s*(::=|:)", re.MULTILINE)


def check_bounds(constraint: StructuredOutput, limits: StructuredOutputLimits) -> None:
    """Raise ConstraintError if ``constraint`` is over one of ``limits`` (cheap: no grammar library)."""
    spec, kind = constraint.spec, constraint.kind
    if kind == "json":
        _at_most(len(spec), limits.max_schema_chars, "a JSON schema of {n} characters", "max-schema-chars")
        try:
            schema = json.loads(spec)
        except (ValueError, RecursionError) as e:
            raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        depth = _json_depth(schema)
        _at_most(depth, limits.max_schema_depth, "a JSON schema nested {n} deep", "max-schema-depth")
    elif kind == "choice":
        choices = json.loads(spec)
        _at_most(len(choices), limits.max_choices, "{n} choices", "max-choices")
        longest = max((len(c) for c in choices), default=0)
        _at_most(longest, limits.max_choice_chars, "a choice of {n} characters", "max-choice-chars")
    elif kind == "regex":
        _at_most(len(spec), limits.max_regex_chars, "a regex of {n} characters", "max-regex-chars")
        _at_most(_bracket_depth(spec), limits.max_nesting, "brackets nested {n} deep", "max-nesting")
    else:
        _at_most(len(spec), limits.max_grammar_chars, "a grammar of {n} characters", "max-grammar-chars")
        rules = len(_RULE_DEFINITION.findall(spec))
        _at_most(rules, limits.max_grammar_rules, "a grammar of {n} rules", "max-grammar-rules")
        _at_most(_bracket_depth(spec), limits.max_nesting, "brackets nested {n} deep", "max-nesting")


def _at_most(n: int, limit: float, what: str, flag: str) -> None:
    if n > limit:
        raise ConstraintError(f"{what.format(n=n)}: this server accepts at most {limit:g} (--{flag})")


def _json_depth(value) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _bracket_depth(text: str) -> int:
    """The deepest nesting of ( [ { in ``text`` (an upper bound: brackets inside literals count too)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return deepest


# --- compiling ------------------------------------------------------------------------------------------

# llguidance compiles grammars recursively on the calling thread's stack: 256 MiB of (virtual) stack holds
# any grammar within the default bounds many times over.
BIG_STACK_BYTES = 256 * 2**20
T = TypeVar("T")


def run_on_big_stack(fn: Callable[[], T]) -> T:
    """``fn()`` on a fresh thread with a ``BIG_STACK_BYTES`` stack; its exception is re-raised here."""
    result: list = []

    def target() -> None:
        try:
            result.append((True, fn()))
        except BaseException as e:  # handed to the caller
            result.append((False, e))

    previous = threading.stack_size(BIG_STACK_BYTES)
    try:
        thread = threading.Thread(target=target, name="sarathi-grammar-compile")
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


def llg_tokenizer(tokenizer_dir: str | None, vocab_size: int, eos_token_ids: tuple[int, ...]):
    """llguidance's tokenizer for the model's ``tokenizer.json`` (~0.3 s for a 49k vocabulary)."""
    from llguidance import LLTokenizer

    path = os.path.join(tokenizer_dir or "", "tokenizer.json")
    if tokenizer_dir is None or not os.path.isfile(path):
        raise ConstraintError("this model has no tokenizer.json; structured outputs need one")
    with open(path) as f:
        return LLTokenizer(f.read(), n_vocab=vocab_size, eos_token=list(eos_token_ids))


def build_matcher(tokenizer, constraint: StructuredOutput):
    """A fresh llguidance matcher for ``constraint`` that has computed its first mask; ConstraintError
    (the library's message, first line only) if it does not compile or admits no output at all.

    Run it on a big stack (``run_on_big_stack``)."""
    import numpy as np
    from llguidance import LLMatcher

    try:
        grammar = to_grammar(constraint)
    except ValueError as e:
        raise ConstraintError(first_line(str(e))) from None
    except Exception as e:  # the library's own error types
        raise ConstraintError(f"the constraint does not compile: {first_line(str(e))}") from None
    matcher = LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise ConstraintError(f"the constraint does not compile: {first_line(matcher.get_error())}")
    mask = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    if matcher.is_error():
        reason = first_line(matcher.get_error())
        raise ConstraintError(f"the constraint admits no output: no text can ever satisfy it ({reason})")
    if not mask.any():
        raise ConstraintError("the constraint admits no output: no text can ever satisfy it")
    return matcher


def first_line(message: str) -> str:
    """A library error without the parser state dump and backtrace that follow its first line."""
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line[:300]


def check_compiles(tokenizer, constraint: StructuredOutput) -> None:
    """ConstraintError if ``constraint`` does not compile to a usable matcher."""
    run_on_big_stack(lambda: build_matcher(tokenizer, constraint))
