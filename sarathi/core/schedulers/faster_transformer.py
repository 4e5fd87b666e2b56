"""FasterTransformer-style request-level batching (paper Algorithm 1)."""

from __future__ import annotations

from sarathi.core.batch import Batch
from sarathi.core.schedulers.base import Scheduler


class FasterTransformerScheduler(Scheduler):
    """Admit a batch of requests only when nothing runs, then decode until all of that batch finished.

    Admission reserves KV for each request's maximum length, so there is never any preemption.
    """

    def _schedule(self, batch: Batch) -> None:
        if self.running:
            self._schedule_decodes(batch)
        else:
            self._admit_whole_prompts(batch, reserve_max_len=True)
