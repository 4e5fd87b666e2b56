"""A request's choices: prompts fanned out into ``n`` / ``best_of`` sequences, the best ``n`` kept, and the
completions API's ``echo`` (the prompt's text and log probabilities before the output's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sarathi.outputs import RequestOutput, TokenLogprob
from sarathi.parallel_sampling import best_indices, child_params, cumulative_logprob
from sarathi.sampling_params import SamplingParams


@dataclass(frozen=True)
class PromptJob:
    """One prompt of a request: its token ids, its sampling parameters and, for ``echo``, its text."""

    prompt_ids: list[int]
    params: SamplingParams
    echo: str | None = None


@dataclass(frozen=True)
class ChoiceJob:
    """One sequence to run: of prompt ``prompt``; ``after``: the sibling whose prefill it waits for."""

    prompt: int
    params: SamplingParams
    after: int | None
    first_of_prompt: bool


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice of a non-streaming response."""

    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None
    num_prompt_tokens: int  # counted once per prompt: 0 for a prompt's second and later choices
    num_output_tokens: int
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0  # of the prompt, read from the prefix cache (0 where num_prompt_tokens is)


def fan_out(jobs: list[PromptJob]) -> list[ChoiceJob]:
    """Every prompt's sequences, prompt by prompt (choice index = prompt * n + i when best_of is n)."""
    out: list[ChoiceJob] = []
    for k, job in enumerate(jobs):
        children = child_params(job.params) if job.params.num_sequences > 1 else [job.params]
        first = len(out)
        for i, params in enumerate(children):
            out.append(ChoiceJob(k, params, first if i else None, i == 0))
    return out


def pick_best(
    jobs: list[PromptJob], choices: list[ChoiceJob], results: list[ChoiceResult]
) -> list[ChoiceResult]:
    """The returned choices: per prompt, its ``n`` most likely sequences of ``best_of`` (in order else)."""
    kept: list[ChoiceResult] = []
    for k, job in enumerate(jobs):
        mine = [r for c, r in zip(choices, results, strict=True) if c.prompt == k]
        p = job.params
        if p.num_sequences > p.n:
            mine = [mine[i] for i in best_indices([cumulative_logprob(r.logprobs or ()) for r in mine], p.n)]
            if p.logprobs is None:  # they were computed only to rank the choices
                mine = [dataclasses.replace(r, logprobs=None) for r in mine]
        # Usage counts a prompt once, however many choices it has.
        mine = [
            dataclasses.replace(r, num_prompt_tokens=0, num_cached_tokens=0) if i else r
            for i, r in enumerate(mine)
        ]
        kept.extend(mine)
    return kept


def echoed(job: PromptJob, text: str, logprobs: list[TokenLogprob] | None, prompt_logprobs) -> tuple:
    """(text, logprobs) with the prompt's before the output's when the request asked for ``echo``; the
    first prompt token has no log probability (nothing comes before it)."""
    if job.echo is None:
        return text, logprobs
    if logprobs is not None and prompt_logprobs is not None:
        first = TokenLogprob(job.prompt_ids[0], None)
        logprobs = [first, *prompt_logprobs[1:], *logprobs]
    return job.echo + text, logprobs


def echoed_delta(job: PromptJob, delta: RequestOutput) -> RequestOutput:
    """A stream's first delta with the echoed prompt in front."""
    text, logprobs = echoed(job, delta.new_text, delta.new_logprobs, delta.prompt_logprobs)
    return dataclasses.replace(delta, new_text=text, new_logprobs=logprobs)
