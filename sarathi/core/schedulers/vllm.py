"""vLLM-style prefill-prioritizing batching (paper Algorithm 2)."""

from __future__ import annotations

from sarathi.core.batch import Batch
from sarathi.core.schedulers.base import Scheduler


class VLLMScheduler(Scheduler):
    """Admit as many whole waiting prompts as fit and run them alone; otherwise run all decodes.

    Prefill-only iterations pause every ongoing decode (a generation stall) while new prompts run. With
    pipelining the choice is made per micro-batch, and the decode batch holds the decodes not in flight.
    """

    def _schedule(self, batch: Batch) -> None:
        self._admit_whole_prompts(batch, reserve_max_len=False)
        if batch.is_empty:
            self._schedule_decodes(batch)
