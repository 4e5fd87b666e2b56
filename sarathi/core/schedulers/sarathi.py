"""Sarathi-Serve's stall-free batching (paper Algorithm 3): decodes first, then prefill chunks."""

from __future__ import annotations

from sarathi.core.batch import Batch
from sarathi.core.schedulers.base import Scheduler


class SarathiScheduler(Scheduler):
    """Every iteration runs all running decodes, then fills the rest of ``token_budget`` with prefill chunks.

    Order: (1) one token for every running decode (preempting the newest sequences if the KV cache is
    full), (2) the next chunk of each partially-prefilled running sequence, (3) new or preempted requests
    FCFS while KV blocks for their whole prompt (or recompute) can be reserved. No running decode is ever
    left out, so ongoing generations never stall behind a long prompt, and an iteration never exceeds
    ``token_budget`` (the running set is capped at ``min(max_num_seqs, token_budget)``).

    With pipelining, (1) and (2) cover the sequences not in flight; a decode is left out of a micro-batch
    only while the blocks it needs can come from nothing but in-flight sequences newer than it.
    """

    chunked_prefills = True

    def _schedule(self, batch: Batch) -> None:
        self._schedule_decodes(batch)
        self._schedule_prefill_chunks(batch)
