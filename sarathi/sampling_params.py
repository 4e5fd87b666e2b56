"""Per-request sampling parameters, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request and when to stop.

    temperature 0 (or anything below 1e-5) means greedy. top_k 0 (or -1) means no top-k cut. A seed
    makes the request's samples reproducible regardless of which other requests share its batches. EOS,
    stop token ids and stop strings are ignored until ``min_tokens`` tokens have been generated.
    ``logprobs`` = n returns, for every generated token, its log probability under the model and the n
    most likely alternatives (0: the token's own only); these are the model's raw distribution, before
    temperature, top-k and top-p.
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

    def __post_init__(self) -> None:
        # Accept lists/single strings from callers, store tuples so the object stays hashable.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if (
            isinstance(self.min_tokens, bool)
            or not isinstance(self.min_tokens, int)
            or not 0 <= self.min_tokens <= self.max_tokens
        ):
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if not isinstance(self.temperature, int | float) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool)
            or not isinstance(self.logprobs, int)
            or not 0 <= self.logprobs <= 20
        ):
            raise ValueError(f"logprobs must be an integer in [0, 20] or None, got {self.logprobs!r}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids!r}")

    @property
    def greedy(self) -> bool:
        """True when the request always takes the most likely token: temperature below
        ``GREEDY_TEMPERATURE`` (as vLLM; dividing logits by ~1e-38 would overflow them) or top_k 1."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1


GREEDY = SamplingParams(temperature=0.0)
