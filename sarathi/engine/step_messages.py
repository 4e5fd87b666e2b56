"""What crosses the engine / worker boundary: plain, picklable data, never live ``Sequence`` objects.

A request's prompt and sampling parameters go to the workers once (``NewRequest``); after that each step
carries only what changed: the output tokens the workers have not seen, the new KV block ids, and which
tokens to compute (``ScheduledRequest``). Workers keep their own copy of every request's tokens and block
table. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sarathi.outputs import TokenLogprob
from sarathi.sampling_params import SamplingParams
from sarathi.structured_output import StructuredOutput


@dataclass(frozen=True)
class NewRequest:
    """A request the workers do not hold yet (first scheduled, or readmitted after a preemption)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[list[int]]  # per KV-cache group; NULL_BLOCK (-1) where a sliding group dropped one


@dataclass(frozen=True)
class ScheduledRequest:
    """``num_tokens`` tokens of a request from position ``start``; ``samples``: produce its next token.

    ``new_token_ids`` are output tokens sampled since the workers last saw the request and
    ``new_block_ids`` blocks appended to its table of each KV-cache group since then.
    """

    request_id: str
    start: int
    num_tokens: int
    samples: bool
    new_token_ids: list[int] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class GrammarJob:
    """Build the structured-output matcher of a request that is not scheduled yet: the engine schedules
    it once the sampling worker reports the matcher ready (``StepOutput.grammars_ready``)."""

    request_id: str
    constraint: StructuredOutput


@dataclass(frozen=True)
class StepInput:
    """One micro-batch for every worker. Workers drop ``freed_request_ids`` first, then add
    ``new_requests``, then run ``scheduled`` in order (the flattened batch order). A step with nothing
    scheduled runs no model: it only carries ``grammar_jobs`` or asks which matchers are ready."""

    step_id: int
    new_requests: list[NewRequest]
    scheduled: list[ScheduledRequest]
    freed_request_ids: list[str]
    grammar_jobs: list[GrammarJob] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


@dataclass(frozen=True)
class SampledToken:
    """One sampling row's result: a token (and its logprobs if asked), or why this row failed
    (``error_code`` "invalid_structured_output" when the request's own constraint failed)."""

    token_id: int | None
    logprob: TokenLogprob | None = None
    error: str | None = None
    error_code: str | None = None


@dataclass(frozen=True)
class PromptLogprobs:
    """Log probabilities of prompt tokens ``start``, ``start + 1``, ... of a request, each given the tokens
    before it (computed from a prefill chunk's logits)."""

    request_id: str
    start: int
    logprobs: list[TokenLogprob]


@dataclass(frozen=True)
class StageTiming:
    """When one pipeline stage (its tensor-parallel rank 0) started and ended a step (monotonic clock)."""

    step_id: int
    stage: int
    start: float
    end: float


@dataclass(frozen=True)
class StepOutput:
    """The last stage's answer to a step: one ``SampledToken`` per sampling entry, in batch order, the
    prompt log probabilities its prefill chunks computed for the requests that asked for them, and the
    prepared requests whose matcher is ready or failed to build (repeated until they are scheduled)."""

    step_id: int
    sampled: list[SampledToken]
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    grammars_ready: list[str] = field(default_factory=list)
    grammar_errors: list[tuple[str, str]] = field(default_factory=list)
