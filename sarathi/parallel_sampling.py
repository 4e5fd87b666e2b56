"""``n`` and ``best_of``: one request fanned out into independent sequences, and the best ``n`` kept.

Pure Python. The engine runs one sequence per request; the front ends (the offline ``LLM`` and the server)
turn a request with ``n`` > 1 or ``best_of`` into ``best_of`` child requests with these parameters. The
children after the first wait for its prefill (``LLMEngine.add_request(after=...)``), so with prefix caching
they read the prompt's KV blocks instead of computing them again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sarathi.outputs import TokenLogprob
from sarathi.sampling_params import SamplingParams


def child_params(params: SamplingParams) -> list[SamplingParams]:
    """One ``SamplingParams`` per sequence to sample: seed + i for child i, and token log probabilities
    when the best ``n`` of ``best_of`` must be ranked by them."""
    ranking = params.num_sequences > params.n
    logprobs = params.logprobs
    if ranking and logprobs is None:
        logprobs = 0
    children = []
    for i in range(params.num_sequences):
        seed = None if params.seed is None else params.seed + i
        child = dataclasses.replace(params, n=1, best_of=None, seed=seed, logprobs=logprobs)
        children.append(child)
    return children


def cumulative_logprob(logprobs: Sequence[TokenLogprob]) -> float:
    """Sum of the generated tokens' log probabilities: how likely the model finds the whole choice."""
    return sum(lp.logprob for lp in logprobs)


def best_indices(scores: Sequence[float], n: int) -> list[int]:
    """Indices of the ``n`` highest scores, best first (ties keep sampling order)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[:n]
