"""Chunked prefills without hybrid batching: the paper's "chunked-prefills only" ablation."""

from __future__ import annotations

from sarathi.config import SchedulerConfig
from sarathi.core.batch import Batch
from sarathi.core.block_manager import BlockManager
from sarathi.core.schedulers.base import Scheduler


class SimpleChunkingScheduler(Scheduler):
    """Iterations are prefill-only (chunks filling ``token_budget``) or decode-only, alternating.

    After a prefill iteration, decode if anything is decoding; otherwise run prefill chunks if there are
    any to run, else decode. A decode turn whose decodes were all preempted runs prefill chunks instead.
    Chunks and admission work as in sarathi (same budget, chunk schedule and running cap); only the
    mixing of decodes and prefills in one iteration is missing.

    With pipelining only sequences not in flight count: a decode turn needs a decode that is not in
    flight, one whose decodes all wait for blocks held by in-flight sequences runs prefill chunks (as if
    they were preempted), and an empty micro-batch (everything in flight) does not change whose turn it is.
    """

    chunked_prefills = True

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int) -> None:
        super().__init__(config, block_manager, max_model_len)
        self._last_was_prefill = False

    def _schedule(self, batch: Batch) -> None:
        decode_turn = self._last_was_prefill and any(
            not s.is_prefill and not self.is_in_flight(s) for s in self.running
        )
        if decode_turn:
            self._schedule_decodes(batch)
        # Also reached when a decode turn preempted every decode (the newest may preempt itself while
        # older partial prefills hold the blocks): those prefills must then make progress.
        if batch.is_empty:
            self._schedule_prefill_chunks(batch)
        if batch.is_empty and not decode_turn:
            self._schedule_decodes(batch)
        if not batch.is_empty:
            self._last_was_prefill = batch.num_prefill_tokens > 0
