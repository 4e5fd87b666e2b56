"""What the engine reports: per-request outputs with latency metrics, and per-iteration stats."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from sarathi.core.sequence import Sequence


@dataclass(frozen=True)
class RequestMetrics:
    """Timestamps (seconds, ``time.monotonic`` clock) of one request and the latencies derived from them."""

    arrival_time: float
    first_scheduled_time: float | None
    token_times: tuple[float, ...]
    finished_time: float | None
    num_preemptions: int

    @classmethod
    def of(cls, seq: Sequence) -> RequestMetrics:
        return cls(
            arrival_time=seq.arrival_time,
            first_scheduled_time=seq.first_scheduled_time,
            token_times=tuple(seq.token_times),
            finished_time=seq.finished_time,
            num_preemptions=seq.num_preemptions,
        )

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def tbts(self) -> list[float]:
        """Every time-between-tokens gap."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def scheduling_delay(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log probability and the most likely alternatives at its position; ``rank`` (1 = the most
    likely token) is set for prompt tokens. ``logprob`` is None only for an echoed prompt's first token
    (nothing comes before it)."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


@dataclass(frozen=True)
class RequestOutput:
    """What one request got in one engine iteration, and where it stands: the one output type, in-process
    and from the engine core to the API process.

    ``new_token_ids`` / ``new_text`` / ``new_logprobs`` are this iteration's part (text that could still
    become a stop string is held back until it is decided), produced at ``token_time``. ``token_ids`` and
    ``text`` (everything) and ``metrics`` are set on a request's final output only, so each output costs
    O(new tokens), in-process and in transport. ``prompt_logprobs`` (asked for with
    ``SamplingParams.prompt_logprobs``) comes with the first token: one entry per prompt token, None for
    the first. ``num_cached_tokens``: the prompt tokens the prefix cache held when the request was
    admitted. ``choices`` holds all choices of a request with ``n`` > 1 (best first) in the offline API's
    results; ``outputs`` reads the same whether or not there are several.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    metrics: RequestMetrics | None = None
    new_logprobs: list[TokenLogprob] | None = None
    error: str | None = None  # set when finish_reason is "error": why the engine failed this request
    error_code: str | None = None  # "invalid_structured_output": the request's own constraint failed
    token_ids: list[int] | None = None
    text: str | None = None
    token_time: float | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    logprobs: list[TokenLogprob] | None = None  # every output token's, on the final output (if asked)
    choices: tuple[RequestOutput, ...] | None = None
    num_cached_tokens: int = 0  # prompt tokens read from the prefix cache at admission

    @property
    def outputs(self) -> list[RequestOutput]:
        """Every choice of the request (just this output when it has one)."""
        return list(self.choices) if self.choices else [self]


@dataclass(frozen=True)
class IterationStats:
    """One engine iteration: what ran and how long it took."""

    iteration: int
    start_time: float
    wall_time: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int
    num_preempted: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_used_blocks: int = 0
    # Tokens of the requests admitted in this iteration, and how many of them the prefix cache held.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    seq_ids: tuple[str, ...] = field(default=(), repr=False)
    step_id: int = -1  # the StepInput that ran this iteration (matches the workers' StageTimings)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens
