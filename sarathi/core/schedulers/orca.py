"""Orca-style iteration-level batching: decodes and whole prompts mixed in one iteration."""

from __future__ import annotations

from sarathi.core.batch import Batch
from sarathi.core.schedulers.base import Scheduler


class OrcaScheduler(Scheduler):
    """All running decodes plus whole new prompts FCFS, up to ``max_num_batched_tokens`` in total.

    Admission reserves KV for a request's maximum length, so running decodes never need preemption.
    With pipelining, the decodes are those not in flight.
    """

    def _schedule(self, batch: Batch) -> None:
        self._schedule_decodes(batch)
        self._admit_whole_prompts(batch, reserve_max_len=True)
