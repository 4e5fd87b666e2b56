"""Request fields clients send (OpenAI's and vLLM's) that this server does not honour.

A field left out, null, or set to the value that asks for the default behaviour passes; any other value
is a 400 naming the field (``param``) with ``code: "unsupported"``, never a 200 that silently ignores it.
Fields that are neither honoured nor listed here are ignored only because they change nothing alone
(``user``, ``guided_decoding_backend``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sarathi.entrypoints.openai.errors import APIError


@dataclass(frozen=True)
class Refusal:
    """One field we do not implement: the values that ask for the default behaviour pass."""

    field: str
    why: str
    passes: Callable[[Any], bool]

    def check(self, body: dict) -> None:
        if self.field in body and body[self.field] is not None and not self.passes(body[self.field]):
            raise APIError(
                f"{self.field}: {self.why}; got {_short(body[self.field])}",
                param=self.field,
                code="unsupported",
            )


def _is(*neutral: Any) -> Callable[[Any], bool]:
    # `type(v) is type(n)` so that e.g. true does not pass for 1 nor 0 for false.
    return lambda v: (
        any(type(v) is type(n) and v == n for n in neutral)
        or (isinstance(v, float) and any(type(n) is int and v == n for n in neutral))
    )


def _never(_: Any) -> bool:
    return False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TOOLS = "the legacy function calling fields are not supported"
_TEMPLATE = "only the model's own chat template is supported"

SAMPLING = (
    Refusal("use_beam_search", "beam search is not supported", _is(False)),
    Refusal("length_penalty", "beam search is not supported (only 1.0)", _is(1)),
    Refusal("early_stopping", "beam search is not supported", _is(False)),
    Refusal("allowed_token_ids", "allowed_token_ids is not supported", _never),
    Refusal("bad_words", "bad_words is not supported", _is([])),
    Refusal("logits_processors", "logits processors are not supported", _is([])),
    Refusal("truncate_prompt_tokens", "prompt truncation is not supported; send a shorter prompt", _never),
    Refusal("skip_special_tokens", "special tokens are always skipped in the output text", _is(True)),
    Refusal("spaces_between_special_tokens", "not configurable here", _is(True)),
    Refusal("return_tokens_as_token_ids", "not supported", _is(False)),
    Refusal("priority", "request priorities are not supported (only 0)", _is(0)),
)

COMPLETIONS = (
    *SAMPLING,
    Refusal("suffix", "suffix (insertion) is not supported", _is("")),
    Refusal("add_special_tokens", "the tokenizer's special tokens are always added", _is(True)),
)

_CHAT_TEMPLATE = (
    Refusal("functions", _TOOLS + "; use tools", _is([])),
    Refusal("function_call", _TOOLS + "; use tool_choice (only 'none')", _is("none")),
    Refusal("chat_template", _TEMPLATE, _never),
    Refusal("chat_template_kwargs", _TEMPLATE + " with its defaults", _is({})),
    Refusal("continue_final_message", "continuing the final message is not supported", _is(False)),
    Refusal("documents", "documents (RAG) are not supported", _is([])),
)

CHAT = (
    *SAMPLING,
    *_CHAT_TEMPLATE,
    Refusal("echo", "echoing the last message is not supported", _is(False)),
    Refusal("add_special_tokens", "the chat template writes the special tokens", _is(False)),
    Refusal("modalities", "text output only", _is(["text"])),
    Refusal("audio", "audio output is not supported", _never),
    Refusal("prediction", "predicted outputs are not supported", _never),
)

TOKENIZE = _CHAT_TEMPLATE

_STATELESS = "this server is stateless (responses are not stored): send the whole conversation as input"

RESPONSES = (
    *SAMPLING,
    *_CHAT_TEMPLATE,
    Refusal("previous_response_id", _STATELESS, _never),
    Refusal("store", _STATELESS + " with store: false", _is(False)),
    Refusal("conversation", _STATELESS, _never),
    Refusal("background", "background mode is not supported", _is(False)),
    Refusal("reasoning", "reasoning is not supported", _is({})),
    Refusal("include", "no extra output data is supported", _is([])),
    Refusal("prompt", "stored prompt templates are not supported", _never),
    Refusal("max_tool_calls", "not supported; parallel_tool_calls: false allows one call", _never),
    Refusal("top_logprobs", "log probabilities are not supported here", _is(0)),
    Refusal("truncation", "input truncation is not supported (only 'disabled')", _is("disabled")),
    Refusal("service_tier", "service tiers are not supported", _is("auto", "default")),
    Refusal("response_format", "use text.format here", _never),
    Refusal("n", "one output per response", _is(1)),
    Refusal("best_of", "one output per response", _is(1)),
    Refusal("prompt_logprobs", "prompt log probabilities are not supported here", _never),
)


def check_refusals(body: dict, refusals: tuple[Refusal, ...]) -> None:
    """Raise APIError for the first field of ``body`` that asks for something we do not do."""
    for refusal in refusals:
        refusal.check(body)
