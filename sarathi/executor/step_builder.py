"""Engine side of the worker protocol: turns scheduler batches into ``StepInput`` deltas.

It remembers what the workers already hold for every request (tokens, block ids) so each step sends only
what changed. Pure Python (no torch): the simulator drives the same builder.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sarathi.core.batch import Batch
from sarathi.core.block_manager import BlockManager
from sarathi.executor.messages import NewRequest, ScheduledRequest, StepInput


@dataclass
class _Sent:
    num_output_tokens: int
    num_block_ids: int


class StepBuilder:
    """Builds the plain-data step for each batch; call ``free`` when a request leaves the workers."""

    def __init__(self, block_manager: BlockManager) -> None:
        self.block_manager = block_manager
        self._sent: dict[str, _Sent] = {}
        self._freed: list[str] = []
        self._step_ids = itertools.count()

    def free(self, request_id: str) -> None:
        """The request finished, was aborted or preempted: workers drop it before the next step."""
        if self._sent.pop(request_id, None) is not None:
            self._freed.append(request_id)

    def build(self, batch: Batch) -> StepInput:
        for seq in batch.preempted:
            self.free(seq.seq_id)
        new_requests, scheduled = [], []
        for entry in batch.entries:
            seq = entry.seq
            table = self.block_manager.block_table_view(seq.seq_id)
            sent = self._sent.get(seq.seq_id)
            if sent is None:
                new_requests.append(
                    NewRequest(
                        seq.seq_id,
                        list(seq.prompt_token_ids),
                        list(seq.output_token_ids),
                        seq.sampling_params,
                        list(table),
                    )
                )
                sent = self._sent[seq.seq_id] = _Sent(seq.num_output_tokens, len(table))
                new_tokens, new_blocks = [], []
            else:
                new_tokens = seq.output_token_ids[sent.num_output_tokens :]
                new_blocks = table[sent.num_block_ids :]
                sent.num_output_tokens, sent.num_block_ids = seq.num_output_tokens, len(table)
            scheduled.append(
                ScheduledRequest(
                    seq.seq_id,
                    entry.start,
                    entry.num_tokens,
                    entry.samples,
                    list(new_tokens),
                    list(new_blocks),
                )
            )
        freed, self._freed = self._freed, []
        return StepInput(next(self._step_ids), new_requests, scheduled, freed)
