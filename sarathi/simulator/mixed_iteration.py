"""The mixed iteration of a token budget: one full chunk of a prompt beside the decodes that run at a load.

This is the iteration stall-free batching makes over and over under load, and the one a TBT SLO must hold
for: every running decode waits for it. Its decode count and context come from a simulated run at that
load (``LoadShape.of_store``); with no run, a single decode at short context stands for the lightest load.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.metrics import percentile

# Which share of the iterations' decode counts the check covers.
DECODES_PERCENTILE = 90


@dataclass(frozen=True)
class LoadShape:
    """How many decodes run beside a chunk at some load, and the tokens each has cached."""

    decodes: int
    context: int

    @classmethod
    def of_store(cls, store, block_size: int) -> LoadShape:
        """From a run's iteration records: the ``DECODES_PERCENTILE`` decode count of iterations that ran
        decodes, and the mean KV tokens per running sequence in them."""
        its = [it for it in store.iterations if it.num_decode_tokens > 0]
        if not its:
            return LIGHTEST
        decodes = round(percentile([it.num_decode_tokens for it in its], DECODES_PERCENTILE))
        context = statistics.fmean(it.num_used_blocks * block_size / max(it.num_running, 1) for it in its)
        return cls(max(1, decodes), max(1, round(context)))


LIGHTEST = LoadShape(decodes=1, context=256)


def mixed_iteration_time(model: LatencyModel, token_budget: int, load: LoadShape) -> float:
    """Predicted seconds of an iteration of ``token_budget`` tokens: ``load.decodes`` decodes (at most
    ``token_budget - 1``) and a chunk of the rest, all after ``load.context`` cached tokens."""
    decodes = max(0, min(load.decodes, token_budget - 1))
    chunk = token_budget - decodes
    chunks = [(load.context, 1)] * decodes + [(load.context, chunk)]
    return model.iteration_time(BatchShape.from_chunks(chunks))
