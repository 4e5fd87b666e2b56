"""What every batching policy shares: queues, request checks, admission, preemption and step bookkeeping.

A policy only decides which sequences get how many tokens in the next iteration (``_schedule``); the
helpers here keep the queues, the block manager and the sequences consistent while it does.

Pipeline parallelism: ``schedule`` may be called again before the earlier batches' ``finish_step`` (which
must come in the order the batches were scheduled). A sequence in such an in-flight batch is skipped by
every policy and is never a preemption victim until its batch finishes: its next token depends on it.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar, Protocol

from sarathi.config import SchedulerConfig
from sarathi.core.batch import Batch
from sarathi.core.block_hash import BlockHash, update_block_hashes
from sarathi.core.block_manager import BlockManager
from sarathi.core.sequence import Sequence, SequenceStatus
from sarathi.sampling_params import InvalidRequestError


class BudgetController(Protocol):
    """Sets the token budget of the next iteration (at most ``token_budget``) just before it is planned."""

    def budget(self, scheduler: Scheduler, now: float) -> int: ...


class Scheduler(ABC):
    """Base class of the batching policies.

    ``waiting`` is first-come-first-served, with preempted sequences at its front (in arrival order);
    ``running`` holds the sequences that own KV blocks, in arrival order. Preemption is by recompute and
    always picks the latest-arrived running sequence that is not in flight.

    With the block manager's prefix cache enabled, a sequence being admitted (new, or readmitted after
    preemption) starts with its longest cached prefix of full blocks already computed, never including
    its last token (the model must run on it to produce logits); full blocks are offered to the cache as
    soon as their KV is computed.

    A non-empty batch is in flight from ``schedule`` until its ``finish_step``, and any number of batches
    may be in flight at once (one per pipeline stage). An empty batch is never in flight and needs no
    ``finish_step``.
    """

    #: Policies that split prompts into chunks under ``token_budget`` (sarathi, simple_chunking). The
    #: others run whole prompts in one iteration, so a prompt (or a recompute) must fit
    #: ``max_num_batched_tokens``.
    chunked_prefills: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int) -> None:
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = config.max_num_batched_tokens or max_model_len
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self._arrival_rank: dict[str, int] = {}
        self._ranks = itertools.count()
        # By identity, not id: an aborted request's id may come back as a new request while its batch runs.
        self._in_flight: set[Sequence] = set()
        self._in_flight_batches: collections.deque[Batch] = collections.deque()
        #: Optional: sets each iteration's budget (the adaptive budget); None keeps ``token_budget``.
        self.budget_controller: BudgetController | None = None
        self.iteration_budget = config.token_budget

    @property
    def max_running(self) -> int:
        """Cap on the running set.

        The chunking policies also cap it at ``token_budget``: every running sequence may be decoding at
        once, and each decode takes one token of the budget, so this is what guarantees that all running
        decodes always fit in one iteration.
        """
        if self.chunked_prefills:
            return min(self.config.max_num_seqs, self.config.token_budget)
        return self.config.max_num_seqs

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_in_flight_batches(self) -> int:
        """Batches scheduled whose ``finish_step`` has not come yet."""
        return len(self._in_flight_batches)

    def is_in_flight(self, seq: Sequence) -> bool:
        """Whether ``seq`` is in a batch whose ``finish_step`` has not come yet (it may be aborted since)."""
        return seq in self._in_flight

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running (in-flight batches of aborted ones do not count)."""
        return bool(self.waiting or self.running)

    # --- requests ----------------------------------------------------------------------------------------
    def check_request(self, seq: Sequence) -> None:
        """InvalidRequestError (naming the prompt) if ``seq`` could never be served by this scheduler."""
        if seq.num_prompt_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"request {seq.seq_id!r}: prompt has {seq.num_prompt_tokens} tokens, "
                f"more than max_model_len={self.max_model_len}",
                "prompt",
            )
        need = seq.max_num_tokens
        bm = self.block_manager
        if not bm.fits_in_empty_cache(need):
            raise InvalidRequestError(
                f"request {seq.seq_id!r}: {need} tokens (prompt + max_tokens) need "
                f"{bm.blocks_needed(need)} KV blocks, but the cache can admit at most "
                f"{bm.num_blocks - bm.watermark_blocks} blocks of {bm.block_size} tokens",
                "prompt",
            )
        if not self.chunked_prefills and need > self.max_num_batched_tokens:
            raise InvalidRequestError(
                f"request {seq.seq_id!r}: {need} tokens (prompt + max_tokens) exceed "
                f"max_num_batched_tokens={self.max_num_batched_tokens}; the {self.config.name!r} scheduler "
                "runs a whole prompt (or a recompute of prompt + outputs) in one batch",
                "prompt",
            )

    def add_sequence(self, seq: Sequence) -> None:
        """Validate ``seq`` and queue it."""
        if seq.seq_id in self._arrival_rank:
            raise ValueError(f"request {seq.seq_id!r} is already queued or running")
        self.check_request(seq)
        self._arrival_rank[seq.seq_id] = next(self._ranks)
        self.waiting.append(seq)

    # --- one iteration -----------------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch:
        """Pick the next iteration's batch; blocks for every scheduled token are reserved on return.

        Sequences in in-flight batches are left out, so the batch may be empty even with work left; a
        non-empty batch is in flight until its ``finish_step``.
        """
        batch = Batch()
        if self.budget_controller is not None:
            budget = self.budget_controller.budget(self, now)
            self.iteration_budget = max(1, min(budget, self.config.token_budget))
        self._schedule(batch)
        for entry in batch:
            self.block_manager.materialize(entry.seq.seq_id, entry.start, entry.start + entry.num_tokens)
            entry.seq.mark_scheduled(now)
            self._in_flight.add(entry.seq)
        if not batch.is_empty:
            self._in_flight_batches.append(batch)
        return batch

    @abstractmethod
    def _schedule(self, batch: Batch) -> None:
        """Fill ``batch`` using the helpers below."""

    def finish_step(self, batch: Batch, new_token_ids: Mapping[str, int], now: float) -> list[Sequence]:
        """Account for a batch the model has run; return the sequences that finished in it.

        Batches must finish in the order they were scheduled; an empty batch is a no-op.
        """
        if batch.is_empty:
            return []
        if not self._in_flight_batches or self._in_flight_batches[0] is not batch:
            raise RuntimeError(
                "stale batch: it is not the oldest in-flight batch (finished twice, out of order, "
                "or not scheduled here)"
            )
        self._in_flight_batches.popleft()
        for entry in batch:
            self._in_flight.discard(entry.seq)
        finished = []
        for entry in batch:
            seq = entry.seq
            if seq.is_finished:  # aborted while the batch was running
                continue
            if seq.num_computed_tokens != entry.start:
                raise RuntimeError(
                    f"stale batch: {seq.seq_id!r} was scheduled from token {entry.start} "
                    f"but has {seq.num_computed_tokens} computed"
                )
            seq.num_computed_tokens += entry.num_tokens
            bs = self.block_manager.block_size
            # Blocks become cacheable only when the computed tokens cross a block boundary.
            if self.block_manager.enable_caching and seq.num_computed_tokens // bs > entry.start // bs:
                hashes = update_block_hashes(seq, self.block_manager.block_size)
                self.block_manager.cache_full_blocks(seq.seq_id, hashes, seq.num_computed_tokens)
            if entry.samples:
                try:
                    token_id = new_token_ids[seq.seq_id]
                except KeyError:
                    raise KeyError(f"no sampled token for {seq.seq_id!r}") from None
                seq.append_token(token_id, now)
                if seq.is_finished:
                    self._release(seq)
                    finished.append(seq)
        return finished

    def finish_sequence(
        self, seq: Sequence, status: SequenceStatus, now: float, stop_reason: int | str | None = None
    ) -> None:
        """Finish ``seq`` for a reason found outside the scheduler (a stop string); frees its blocks.

        A no-op for a sequence that has already finished.
        """
        if seq.is_finished:
            return
        seq.finish(status, now, stop_reason)
        self._release(seq)

    def abort_sequence(self, seq_id: str, now: float) -> Sequence | None:
        """Abort a waiting or running request; returns it, or None if it is not here."""
        seq = next((s for s in itertools.chain(self.waiting, self.running) if s.seq_id == seq_id), None)
        if seq is not None:
            self.finish_sequence(seq, SequenceStatus.FINISHED_ABORTED, now)
        return seq

    # --- helpers for the policies ------------------------------------------------------------------------
    def _arrival_key(self, seq: Sequence) -> tuple[float, int]:
        return seq.arrival_time, self._arrival_rank[seq.seq_id]

    def _release(self, seq: Sequence) -> None:
        """Drop a finished sequence from the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq.seq_id)
        self._arrival_rank.pop(seq.seq_id, None)

    def _reusable_hashes(self, seq: Sequence) -> list[BlockHash]:
        """Hashes of the full blocks ``seq`` may take from the prefix cache: not the block of its last
        token, which must be computed to have logits to sample from. Nothing for a request that still
        needs its prompt's log probabilities: cached positions would have no logits."""
        bm = self.block_manager
        if not bm.enable_caching:
            return []
        if seq.sampling_params.prompt_logprobs is not None and seq.num_output_tokens == 0:
            return []
        return update_block_hashes(seq, bm.block_size)[: (seq.num_tokens - 1) // bm.block_size]

    def _num_cached_tokens(self, seq: Sequence) -> int:
        """Tokens of a waiting ``seq`` that admitting it now would find in the prefix cache."""
        bm = self.block_manager
        return bm.prefix_hit(self._reusable_hashes(seq)) * bm.block_size

    def _can_admit(self, seq: Sequence, reserve_tokens: int) -> bool:
        return len(self.running) < self.max_running and self.block_manager.can_allocate(
            reserve_tokens, self._reusable_hashes(seq)
        )

    def _admit_head(self, reserve_tokens: int, batch: Batch) -> Sequence:
        """Move the head of the waiting queue to running with KV room for ``reserve_tokens`` tokens;
        its cached prefix counts as computed."""
        seq = self.waiting.popleft()
        bm = self.block_manager
        num_hits = bm.allocate(seq.seq_id, reserve_tokens, self._reusable_hashes(seq))
        seq.num_computed_tokens = num_hits * bm.block_size
        if seq.first_scheduled_time is None:  # a preempted request's re-admission does not count
            seq.num_cached_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
        if bm.enable_caching:
            batch.prefix_cache_queries += seq.num_tokens
            batch.prefix_cache_hits += seq.num_computed_tokens
        bisect.insort(self.running, seq, key=self._arrival_key)
        return seq

    def _preempt(self, seq: Sequence, batch: Batch) -> None:
        """Preempt by recompute: free the KV, requeue at the front of waiting among earlier preempted."""
        self.block_manager.free(seq.seq_id)
        seq.preempt()
        self.running.remove(seq)
        key = self._arrival_key(seq)
        i = 0
        while (
            i < len(self.waiting)
            and self.waiting[i].status is SequenceStatus.PREEMPTED
            and self._arrival_key(self.waiting[i]) < key
        ):
            i += 1
        self.waiting.insert(i, seq)
        batch.preempted.append(seq)

    def _reserve_decode_slot(self, seq: Sequence, batch: Batch) -> bool:
        """Grow ``seq``'s table by its next token, preempting the newest running sequences until it fits.

        In-flight sequences are never victims. Returns False if ``seq`` is not to be scheduled: it was
        itself the newest running sequence and got preempted, or every newer one is in flight (it waits:
        they become victims once their batches finish).
        """
        need = seq.num_computed_tokens + 1
        while not self.block_manager.try_append_slots(seq.seq_id, need):
            victim = next(s for s in reversed(self.running) if s not in self._in_flight)
            if victim is seq and seq is not self.running[-1]:
                return False
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _schedule_decodes(self, batch: Batch) -> None:
        """Add one token of every running decode that is not in flight, oldest first.

        Victims come from the newest end of ``running``, so a sequence already added here never is one.
        """
        for seq in [s for s in self.running if not s.is_prefill and s not in self._in_flight]:
            if seq.status is SequenceStatus.PREEMPTED:  # the victim of an older decode
                continue
            if self._reserve_decode_slot(seq, batch):
                batch.add(seq, 1)

    def _admit_whole_prompts(self, batch: Batch, reserve_max_len: bool) -> None:
        """Admit waiting requests FCFS with their whole prompt (or recompute) while they fit.

        They must fit ``max_num_batched_tokens`` together with what ``batch`` already holds, the running
        cap and the free KV blocks: room for their current tokens, or for their maximum length if
        ``reserve_max_len`` (then they never need to grow, so never cause preemption).
        """
        while self.waiting:
            seq = self.waiting[0]
            reserve = seq.max_num_tokens if reserve_max_len else seq.num_tokens
            to_compute = seq.num_tokens - self._num_cached_tokens(seq)
            fits_batch = batch.num_tokens + to_compute <= self.max_num_batched_tokens
            if not (fits_batch and self._can_admit(seq, reserve)):
                return
            self._admit_head(reserve, batch)
            batch.add(seq, seq.num_uncomputed_tokens)

    def _chunk_size(self, seq: Sequence, batch: Batch, start: int | None = None) -> int:
        """Tokens of ``seq``'s prefill from ``start`` (default: its computed count) that fit in ``batch``.

        The budget is ``token_budget`` (or the budget controller's for this iteration), lowered to the
        chunk schedule's size for the prompt's progress.
        """
        start = seq.num_computed_tokens if start is None else start
        budget = self.iteration_budget
        if self.config.chunk_schedule is not None:
            budget = min(budget, self.config.chunk_schedule.chunk_size(start))
        return max(0, min(seq.num_tokens - start, budget - batch.num_tokens))

    def _schedule_prefill_chunks(self, batch: Batch) -> None:
        """Add the next chunk of each running partial prefill not in flight, then admit requests FCFS.

        Admission (of new or preempted requests) reserves KV for all of a request's current tokens, so
        its later chunks never need memory.
        """
        for seq in self.running:
            if seq.is_prefill and seq not in self._in_flight and (n := self._chunk_size(seq, batch)) > 0:
                batch.add(seq, n)
        while self.waiting:
            seq = self.waiting[0]
            n = self._chunk_size(seq, batch, start=self._num_cached_tokens(seq))
            if n == 0 or not self._can_admit(seq, seq.num_tokens):
                return
            self._admit_head(seq.num_tokens, batch)
            batch.add(seq, n)
