"""Per-request sampling parameters, validated on construction; InvalidRequestError names the bad field."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sarathi.structured_output import StructuredOutput

GREEDY_TEMPERATURE = 1e-5
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on one logit_bias value
MAX_CHOICES = 64  # n and best_of: each choice is a sequence of its own


class InvalidRequestError(ValueError):
    """A request refused as given. ``param`` names the request field at fault (the OpenAI field name,
    e.g. "prompt", "stop_token_ids", "temperature"); ``code`` is an optional machine-readable reason."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _invalid(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param} {why}", param)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request and when to stop.

    temperature 0 (or anything below 1e-5) means greedy. top_k 0 (or -1) means no top-k cut. A seed
    makes the request's samples reproducible regardless of which other requests share its batches. EOS,
    stop token ids and stop strings are ignored until ``min_tokens`` tokens have been generated.
    ``logprobs`` = n returns, for every generated token, its log probability under the model and the n
    most likely alternatives (0: the token's own only); these are the model's raw distribution, before
    temperature, top-k and top-p.

    Logit controls (vLLM's semantics), applied in this order before temperature: ``logit_bias`` (token id ->
    value added to its logit, |value| <= 100), ``repetition_penalty`` (> 0; a token seen in the prompt or
    the output has a positive logit divided by it and a negative one multiplied), ``frequency_penalty``
    and ``presence_penalty`` (in [-2, 2]; subtracted per occurrence / once for each token of the output).
    ``min_p`` (in [0, 1]) then drops tokens whose probability after temperature is below ``min_p`` times
    the most likely token's.

    ``prompt_logprobs`` = k returns, for every prompt token after the first, its log probability given the
    tokens before it, its rank, and the k most likely alternatives (a request asking for them does not take
    prompt blocks from the prefix cache: cached positions have no logits).

    ``n`` choices are returned per request, the ``n`` most likely (by cumulative log probability) of
    ``best_of`` (default ``n``) sampled independently; a seeded request's choice i uses seed + i. The engine
    runs one sequence per request: the front ends (``LLM``, the server) fan a request out into its choices.

    ``structured_output`` constrains the output to a JSON schema, regex, choice or grammar: tokens that
    cannot continue a match are masked out before all of the above, and once the match is complete only
    EOS remains (see ``sarathi/structured_output.py``).
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float = 0.0
    structured_output: StructuredOutput | None = None
    prompt_logprobs: int | None = None
    n: int = 1
    best_of: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", _logit_bias_pairs(self.logit_bias))
        _check_number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_number("min_p", self.min_p, 0.0, 1.0)
        _check_number("repetition_penalty", self.repetition_penalty, 0.0, 1e9)
        if self.repetition_penalty == 0:
            raise _invalid("repetition_penalty", "must be > 0, got 0")
        # Accept lists/single strings from callers, store tuples so the object stays hashable.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise _invalid("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if (
            isinstance(self.min_tokens, bool)
            or not isinstance(self.min_tokens, int)
            or not 0 <= self.min_tokens <= self.max_tokens
        ):
            raise _invalid("min_tokens", f"must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if not isinstance(self.temperature, int | float) or self.temperature < 0:
            raise _invalid("temperature", f"must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise _invalid("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise _invalid("top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise _invalid("seed", f"must be an integer or None, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise _invalid("stop", f"must be a list of non-empty strings, got {self.stop!r}")
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool)
            or not isinstance(self.logprobs, int)
            or not 0 <= self.logprobs <= 20
        ):
            raise _invalid("logprobs", f"must be an integer in [0, 20] or None, got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (
            isinstance(self.prompt_logprobs, bool)
            or not isinstance(self.prompt_logprobs, int)
            or not 0 <= self.prompt_logprobs <= 20
        ):
            raise _invalid(
                "prompt_logprobs", f"must be an integer in [0, 20] or None, got {self.prompt_logprobs!r}"
            )
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_CHOICES:
            raise _invalid("n", f"must be an integer in [1, {MAX_CHOICES}], got {self.n!r}")
        if self.best_of is not None and (
            isinstance(self.best_of, bool)
            or not isinstance(self.best_of, int)
            or not self.n <= self.best_of <= MAX_CHOICES
        ):
            raise _invalid(
                "best_of", f"must be an integer in [n, {MAX_CHOICES}] or None, got {self.best_of!r}"
            )
        if self.structured_output is not None and not isinstance(self.structured_output, StructuredOutput):
            raise _invalid("structured_output", f"must be a StructuredOutput, got {self.structured_output!r}")
        if any(t < 0 for t in self.stop_token_ids):
            raise _invalid("stop_token_ids", f"must be non-negative, got {self.stop_token_ids!r}")

    @property
    def penalized(self) -> bool:
        """True when a repetition, frequency or presence penalty is set (they need the token history)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def num_sequences(self) -> int:
        """Sequences sampled for this request: ``best_of``, else ``n``."""
        return self.n if self.best_of is None else self.best_of

    @property
    def greedy(self) -> bool:
        """True when the request always takes the most likely token: temperature below
        ``GREEDY_TEMPERATURE`` (as vLLM; dividing logits by ~1e-38 would overflow them) or top_k 1."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1


def _check_number(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _invalid(name, f"must be a number in [{low}, {high}], got {value!r}")


def _logit_bias_pairs(bias: Mapping | Iterable | None) -> tuple[tuple[int, float], ...]:
    """``{token id (int or its decimal string): bias}`` or pairs -> sorted ``((id, bias), ...)``."""
    items = bias.items() if isinstance(bias, Mapping) else (bias or ())
    pairs = {}
    for item in items:
        try:
            key, value = item
        except (TypeError, ValueError):
            raise _invalid("logit_bias", f"must map token ids to numbers, got {item!r}") from None
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise _invalid("logit_bias", f"keys must be token ids (integers >= 0), got {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) <= MAX_LOGIT_BIAS:
            raise _invalid("logit_bias", f"values must be numbers in [-100, 100], got {value!r} for {key}")
        pairs[key] = float(value)
    return tuple(sorted(pairs.items()))


GREEDY = SamplingParams(temperature=0.0)
