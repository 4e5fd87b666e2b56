"""A request as the scheduler sees it: tokens, prefill progress, status and timestamps.

Pure Python (no torch): the scheduler, the block manager and the simulator all work on these objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sarathi.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue after losing its KV cache (recompute)
    FINISHED_STOPPED = "stop"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "length"  # max_tokens or the model's max length
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # processing this request raised inside the engine; other requests go on

    @property
    def is_finished(self) -> bool:
        return self._value_ in _FINISHED_VALUES  # a str lookup: Enum.__hash__ is slow and this is hot

    @property
    def finish_reason(self) -> str | None:
        """OpenAI-style finish reason, or None while the sequence is alive."""
        return self.value if self.is_finished else None


_FINISHED = {
    SequenceStatus.FINISHED_STOPPED,
    SequenceStatus.FINISHED_LENGTH,
    SequenceStatus.FINISHED_ABORTED,
    SequenceStatus.FINISHED_ERROR,
}
_FINISHED_VALUES = frozenset(s.value for s in _FINISHED)


@dataclass(eq=False)
class Sequence:
    """One request: prompt, generated tokens and how many of its tokens have KV in the cache.

    The scheduler's single rule is that ``num_computed_tokens`` catches up to ``num_tokens``: a sequence
    still in prefill is many tokens behind, a decoding one is exactly one behind (its last sampled token).
    Preemption by recompute sets ``num_computed_tokens`` back to 0 and keeps the generated tokens, so the
    recompute prefill covers prompt + output.
    """

    seq_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    # False while the (re)computed prefill has not produced a token yet.
    prefill_done: bool = False
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    num_preemptions: int = 0
    # Prompt tokens the prefix cache held when the request was first admitted (usage's cached_tokens).
    num_cached_tokens: int = 0
    stop_reason: int | str | None = None
    # Prefix-cache keys of its full blocks (core/block_hash.py), extended as tokens are added.
    block_hashes: list[bytes] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt must contain at least one token")

    # --- sizes -------------------------------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def max_num_tokens(self) -> int:
        """Upper bound on this sequence's length: prompt + max_tokens, capped at the model's max length."""
        return min(self.num_prompt_tokens + self.sampling_params.max_tokens, self.max_model_len)

    @property
    def is_prefill(self) -> bool:
        """True until the (re)computed prompt has produced a token."""
        return not self.prefill_done

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def token_slice(self, start: int, num_tokens: int) -> list[int]:
        """Token ids at positions [start, start + num_tokens) of prompt + output."""
        end = start + num_tokens
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    # --- transitions -------------------------------------------------------------------------------------
    def mark_scheduled(self, now: float) -> None:
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now
        self.status = SequenceStatus.RUNNING

    def append_token(self, token_id: int, now: float) -> None:
        """Record a sampled token and finish the sequence if it hits a stop condition."""
        self.output_token_ids.append(token_id)
        self.token_times.append(now)
        self.prefill_done = True
        params = self.sampling_params
        if not params.ignore_eos and token_id in self.eos_token_ids:
            self.finish(SequenceStatus.FINISHED_STOPPED, now, stop_reason=None)
        elif token_id in params.stop_token_ids:
            self.finish(SequenceStatus.FINISHED_STOPPED, now, stop_reason=token_id)
        elif self.num_output_tokens >= params.max_tokens or self.num_tokens >= self.max_model_len:
            self.finish(SequenceStatus.FINISHED_LENGTH, now)

    def preempt(self) -> None:
        """Drop all computed KV; the sequence will recompute prompt + output when readmitted."""
        self.status = SequenceStatus.PREEMPTED
        self.num_computed_tokens = 0
        self.prefill_done = False
        self.num_preemptions += 1

    def finish(self, status: SequenceStatus, now: float, stop_reason: int | str | None = None) -> None:
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        self.status = status
        self.finished_time = now
        self.stop_reason = stop_reason
