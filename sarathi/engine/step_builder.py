"""Engine side of the worker protocol: turns scheduler batches into ``StepInput`` deltas.

It remembers what the workers already hold for every request (tokens, block ids) so each step sends only
what changed. Pure Python (no torch): the simulator drives the same builder.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sarathi.core.batch import Batch
from sarathi.core.block_manager import BlockManager
from sarathi.engine.step_messages import GrammarJob, NewRequest, ScheduledRequest, StepInput
from sarathi.structured_output import StructuredOutput


@dataclass
class _Sent:
    num_output_tokens: int
    num_block_ids: list[int]  # per KV-cache group


class StepBuilder:
    """Builds the plain-data step for each batch; call ``free`` when a request leaves the workers."""

    def __init__(self, block_manager: BlockManager) -> None:
        self.block_manager = block_manager
        self._sent: dict[str, _Sent] = {}
        self._freed: list[str] = []
        self._grammar_jobs: list[GrammarJob] = []
        self._prepared: set[str] = set()  # grammar jobs sent (or to send) for requests not sent yet
        self._step_ids = itertools.count()

    def prepare_grammar(self, request_id: str, constraint: StructuredOutput) -> None:
        """Have the workers build ``request_id``'s matcher, with the next step."""
        self._grammar_jobs.append(GrammarJob(request_id, constraint))
        self._prepared.add(request_id)

    def free(self, request_id: str) -> None:
        """The request finished, was aborted or preempted: workers drop it before the next step."""
        prepared = request_id in self._prepared
        self._prepared.discard(request_id)
        if self._sent.pop(request_id, None) is not None or prepared:
            self._freed.append(request_id)

    def build(self, batch: Batch) -> StepInput:
        for seq in batch.preempted:
            self.free(seq.seq_id)
        new_requests, scheduled = [], []
        for entry in batch.entries:
            seq = entry.seq
            tables = self.block_manager.block_tables_view(seq.seq_id)
            sent = self._sent.get(seq.seq_id)
            if sent is None:
                new_requests.append(
                    NewRequest(
                        seq.seq_id,
                        list(seq.prompt_token_ids),
                        list(seq.output_token_ids),
                        seq.sampling_params,
                        [list(t) for t in tables],
                    )
                )
                sent = self._sent[seq.seq_id] = _Sent(seq.num_output_tokens, [len(t) for t in tables])
                self._prepared.discard(seq.seq_id)
                new_tokens, new_blocks = [], [[] for _ in tables]
            else:
                new_tokens = seq.output_token_ids[sent.num_output_tokens :]
                new_blocks = [list(t[n:]) for t, n in zip(tables, sent.num_block_ids, strict=True)]
                sent.num_output_tokens, sent.num_block_ids = seq.num_output_tokens, [len(t) for t in tables]
            scheduled.append(
                ScheduledRequest(
                    seq.seq_id,
                    entry.start,
                    entry.num_tokens,
                    entry.samples,
                    list(new_tokens),
                    new_blocks,
                )
            )
        freed, self._freed = self._freed, []
        jobs, self._grammar_jobs = self._grammar_jobs, []
        return StepInput(next(self._step_ids), new_requests, scheduled, freed, jobs)
