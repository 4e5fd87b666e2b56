"""FasterTransformer-style request-level batching (paper Algorithm 1)."""

from __future__ import annotations

from sarathi.core.batch import Batch
from sarathi.core.schedulers.base import Scheduler


class FasterTransformerScheduler(Scheduler):
    """Admit a batch of requests only when nothing runs, then decode until all of that batch finished.

    Admission reserves KV for each request's maximum length, so there is never any preemption. With
    pipelining, admission also waits until no batch is in flight (one of aborted requests may be), so
    request batches never overlap; the running batch is always scheduled whole, so at most one
    micro-batch is ever in flight.
    """

    def _schedule(self, batch: Batch) -> None:
        if self.running:
            self._schedule_decodes(batch)
        elif not self.num_in_flight_batches:
            self._admit_whole_prompts(batch, reserve_max_len=True)
