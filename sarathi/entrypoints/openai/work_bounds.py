"""Bounds on one request's total work, checked before anything reaches the engine: how many choices, how
many batch prompts, how many ids to detokenize, and whether all of a request's sequences could ever be
held by the KV pool at once. A request past one of them can only thrash the pool (preempting the running
streams again and again) or hold the event loop, so it gets a 400 naming the numbers instead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sarathi.config import knob
from sarathi.entrypoints.openai.choices import PromptJob
from sarathi.entrypoints.openai.errors import APIError

DEFAULT_MAX_N = 16
DEFAULT_MAX_BATCH_PROMPTS = 64


@dataclass(frozen=True)
class WorkLimits:
    """Per-request caps; ``max_detokenize_tokens`` None means the model's context length."""

    max_n: int = knob(DEFAULT_MAX_N, "n and best_of a request may ask for", type=int)
    max_batch_prompts: int = knob(DEFAULT_MAX_BATCH_PROMPTS, "prompts in one batch", type=int)
    max_detokenize_tokens: int | None = knob(None, "ids /detokenize takes (default: context)", type=int)

    def __post_init__(self) -> None:
        for name in ("max_n", "max_batch_prompts", "max_detokenize_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")

    def check_choices(self, n: int, best_of: int | None) -> None:
        for param, value in (("n", n), ("best_of", best_of)):
            if value is not None and value > self.max_n:
                raise APIError(
                    f"{param}: {value} choices, at most {self.max_n} per request (--max-n)",
                    param=param,
                    code="too_many_choices",
                )

    def check_batch_prompts(self, num_prompts: int) -> None:
        if num_prompts > self.max_batch_prompts:
            raise APIError(
                f"prompt: a batch of {num_prompts} prompts, at most {self.max_batch_prompts} per request "
                "(--max-batch-prompts)",
                param="prompt",
                code="too_many_prompts",
            )

    def check_detokenize(self, num_tokens: int, max_model_len: int) -> None:
        limit = self.max_detokenize_tokens or max_model_len
        if num_tokens > limit:
            raise APIError(
                f"tokens: {num_tokens} token ids, at most {limit} per request (--max-detokenize-tokens)",
                param="tokens",
                code="too_many_tokens",
            )


@dataclass(frozen=True)
class PromptWork:
    """One prompt of a request: its length, its output bound and how many sequences run it."""

    num_prompt_tokens: int
    max_tokens: int
    num_sequences: int  # max(n, best_of)

    @property
    def num_tokens(self) -> int:
        return self.num_sequences * (self.num_prompt_tokens + self.max_tokens)


def check_total_work(prompts: Sequence[PromptWork], num_kv_blocks: int, block_size: int, param: str) -> None:
    """Refuse a request whose sequences, all at their longest, need more KV than the whole pool holds.

    Sibling sequences may share their prompt's blocks under prefix caching, but nothing guarantees they run
    together, so each is counted whole.
    """
    total = sum(p.num_tokens for p in prompts)
    capacity = num_kv_blocks * block_size
    if total <= capacity:
        return
    if len(prompts) == 1:
        p = prompts[0]
        shape = (
            f"{p.num_sequences} sequences x ({p.num_prompt_tokens} prompt + {p.max_tokens} max_tokens) = "
            f"{total} tokens"
        )
    else:
        shape = f"{len(prompts)} prompts whose sequences x (prompt + max_tokens) total {total} tokens"
    raise APIError(
        f"{param}: {shape}, more than the KV cache can ever hold ({num_kv_blocks} blocks x {block_size} "
        f"tokens = {capacity}); lower n, best_of, max_tokens or the number of prompts",
        param=param,
        code="request_too_large",
    )


def check_jobs_fit(jobs: Sequence[PromptJob], num_kv_blocks: int, block_size: int) -> None:
    """``check_total_work`` for a request's prompts; the error names ``prompt`` for a batch, else ``n``
    (or ``best_of``, whichever asked for the sequences)."""
    work = [PromptWork(len(j.prompt_ids), j.params.max_tokens, j.params.num_sequences) for j in jobs]
    if len(jobs) > 1:
        param = "prompt"
    else:
        param = "best_of" if (jobs[0].params.best_of or 0) > jobs[0].params.n else "n"
    check_total_work(work, num_kv_blocks, block_size, param)


def num_batch_prompts(prompt: object) -> int:
    """How many prompts a completions ``prompt`` field holds (read from the raw JSON, before validation)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1
