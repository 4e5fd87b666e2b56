"""The adaptive token budget (the paper's future work): each iteration gets the largest budget whose
predicted time keeps every running decode within the TBT target.

A decode whose last token came ``w`` seconds ago has ``slo - w`` seconds of slack left; the iteration must
end within the smallest slack (times ``margin``, for the latency model's error). The controller searches
the budget by bisection on the latency model's prediction of the iteration that budget would make: every
running decode plus a prefill chunk of the rest, at the context of the prefill that would get it. When
decodes are few or the target is loose the budget grows (up to ``token_budget``); it shrinks as slack
runs out, down to the decodes plus ``min_prefill_tokens`` so prompts still progress.
"""

from __future__ import annotations

import collections
import math

from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel


class AdaptiveBudget:
    """A ``BudgetController`` for the sarathi scheduler (see ``sarathi.core.schedulers.base``)."""

    def __init__(
        self, tbt_slo: float, latency_model: LatencyModel, margin: float = 0.9, min_prefill_tokens: int = 16
    ) -> None:
        if not tbt_slo > 0:
            raise ValueError(f"tbt_slo must be > 0 seconds, got {tbt_slo}")
        if not 0 < margin <= 1:
            raise ValueError(f"margin must be in (0, 1], got {margin}")
        self.tbt_slo = tbt_slo
        self.latency_model = latency_model
        self.margin = margin
        self.min_prefill_tokens = min_prefill_tokens
        self.history: collections.deque[int] = collections.deque(maxlen=100_000)  # recent budgets

    def budget(self, scheduler, now: float) -> int:
        ceiling = scheduler.config.token_budget
        decodes, slack = [], math.inf
        prefill_context = None
        for seq in scheduler.running:
            if scheduler.is_in_flight(seq):
                continue
            if seq.is_prefill:
                if prefill_context is None:
                    prefill_context = seq.num_computed_tokens
                continue
            decodes.append((seq.num_computed_tokens, 1))
            if seq.token_times:
                slack = min(slack, self.tbt_slo - (now - seq.token_times[-1]))
        if prefill_context is None:
            prefill_context = 0
        limit = slack * self.margin
        floor = min(ceiling, len(decodes) + self.min_prefill_tokens)

        def fits(budget: int) -> bool:
            chunk = budget - len(decodes)
            chunks = decodes + ([(prefill_context, chunk)] if chunk > 0 else [])
            return self.latency_model.iteration_time(BatchShape.from_chunks(chunks)) <= limit

        if not decodes or fits(ceiling):
            chosen = ceiling
        elif not fits(floor):
            chosen = floor
        else:
            lo, hi = floor, ceiling  # fits(lo), not fits(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
            chosen = lo
        self.history.append(chosen)
        return chosen
