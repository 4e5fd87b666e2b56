"""Test harness: build schedulers, drive them with a fake model and check their invariants."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from sarathi.config import SchedulerConfig
from sarathi.core.batch import Batch
from sarathi.core.block_manager import NULL_BLOCK, BlockManager
from sarathi.core.schedulers import Scheduler, make_scheduler, max_step_tokens
from sarathi.core.sequence import Sequence, SequenceStatus
from sarathi.sampling_params import SamplingParams

FAKE_TOKEN = 7  # what the fake model samples; also the EOS id, so ignore_eos matters


def make_seq(
    seq_id: str,
    prompt_len: int,
    max_tokens: int,
    arrival: float = 0.0,
    max_model_len: int = 1024,
    ignore_eos: bool = True,
) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        prompt_token_ids=[100 + i for i in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
        arrival_time=arrival,
        max_model_len=max_model_len,
        eos_token_ids=(FAKE_TOKEN,),
    )


def build(
    name: str,
    *,
    num_blocks: int = 1024,
    block_size: int = 16,
    watermark: float = 0.0,
    max_model_len: int = 1024,
    enable_caching: bool = False,
    group_windows: tuple[int | None, ...] = (None,),
    **config: object,
) -> Scheduler:
    scheduler_config = SchedulerConfig(name=name, **config)
    bm = BlockManager(
        num_blocks,
        block_size,
        watermark,
        enable_caching=enable_caching,
        group_windows=group_windows,
        max_step_tokens=max_step_tokens(scheduler_config),
    )
    return make_scheduler(scheduler_config, bm, max_model_len)


def fake_tokens(batch: Batch) -> dict[str, int]:
    """What the fake model samples for ``batch``."""
    return {e.seq.seq_id: FAKE_TOKEN for e in batch if e.samples}


def step(sched: Scheduler, now: float = 0.0) -> tuple[Batch, list[Sequence]]:
    """One iteration with the fake model: schedule, 'run' and account."""
    batch = sched.schedule(now)
    finished = sched.finish_step(batch, fake_tokens(batch), now)
    return batch, finished


class Pipeline:
    """Pipeline parallelism with the fake model: batches stay in flight until finished, oldest first."""

    def __init__(self, sched: Scheduler, depth: int) -> None:
        self.sched = sched
        self.depth = depth
        self.in_flight: collections.deque[Batch] = collections.deque()

    def schedule(self, now: float = 0.0) -> Batch:
        """One ``schedule`` call; a non-empty batch joins the in-flight ones."""
        batch = self.sched.schedule(now)
        check_writes(self.sched, batch)
        if not batch.is_empty:
            self.in_flight.append(batch)
        return batch

    def fill(self, now: float = 0.0) -> list[Batch]:
        """Schedule until ``depth`` batches are in flight or one comes back empty; return what came back."""
        batches = []
        while len(self.in_flight) < self.depth:
            batches.append(self.schedule(now))
            if batches[-1].is_empty:
                break
        return batches

    def finish_oldest(self, now: float = 0.0) -> list[Sequence]:
        """``finish_step`` of the oldest in-flight batch with the fake model's tokens."""
        batch = self.in_flight.popleft()
        return self.sched.finish_step(batch, fake_tokens(batch), now)

    def check(self) -> None:
        """The scheduler's in-flight view matches this pipeline's, and in-flight sequences keep their KV."""
        sched = self.sched
        assert sched.num_in_flight_batches == len(self.in_flight)
        entries = [e for b in self.in_flight for e in b]
        ids = [e.seq.seq_id for e in entries]
        assert len(ids) == len(set(ids)), "a sequence is in two in-flight batches"
        for entry in entries:
            seq = entry.seq
            assert sched.is_in_flight(seq)
            if not seq.is_finished:  # an aborted one has already given its blocks back
                assert seq in sched.running and seq.status is SequenceStatus.RUNNING
                assert seq.num_computed_tokens == entry.start, "an in-flight sequence was preempted"
                assert sched.block_manager.num_slots(seq.seq_id) >= entry.end
        in_flight = {e.seq for e in entries}
        for seq in sched.running:
            assert sched.is_in_flight(seq) == (seq in in_flight)


def prefill_chunks(batch: Batch) -> list[tuple[str, int]]:
    return [(e.seq.seq_id, e.num_tokens) for e in batch if e.is_prefill]


def decode_ids(batch: Batch) -> set[str]:
    return {e.seq.seq_id for e in batch if not e.is_prefill}


def check_writes(sched: Scheduler, batch: Batch) -> None:
    """The blocks a batch writes KV into are held by their sequence alone and are not in the prefix cache,
    in every KV-cache group, and a sliding group holds every block its window reads."""
    bm = sched.block_manager
    for e in batch:
        for g, table in enumerate(bm.block_tables_view(e.seq.seq_id)):
            for i in range(e.start // bm.block_size, (e.end - 1) // bm.block_size + 1):
                assert bm.ref_count(table[i]) == 1, "a shared block would be written"
                assert bm.block_hash(table[i]) is None, "a cached block would be written"
            window = bm.group_windows[g]
            first_read = 0 if window is None else max(0, e.start - window + 1) // bm.block_size
            assert NULL_BLOCK not in table[first_read:], "a block the window reads was dropped"


def check_blocks(sched: Scheduler) -> None:
    """The block manager and the queues agree; every block is free or owned, and owned as many times as
    its reference count says (more than once only when shared through the prefix cache)."""
    bm = sched.block_manager
    all_tables = {sid: bm.block_tables_view(sid) for sid in bm.seq_ids}
    owned = [b for ts in all_tables.values() for t in ts for b in t if b != NULL_BLOCK]
    free = bm.free_block_ids
    if not bm.enable_caching:
        assert len(owned) == len(set(owned)), "a block is owned twice"
    counts = collections.Counter(owned)
    assert all(bm.ref_count(b) == counts[b] for b in range(bm.num_blocks)), "a wrong reference count"
    assert len(free) == len(set(free)), "a block is free twice"
    assert not set(owned) & set(free), "a block is both owned and free"
    assert sorted(set(owned) | set(free)) == list(range(bm.num_blocks))
    assert bm.num_used_blocks == len(counts) and bm.num_free_blocks == len(free)
    assert set(all_tables) == {s.seq_id for s in sched.running}, "only running sequences own blocks"
    assert bm.num_available_blocks >= 0, "sliding groups were promised more blocks than are free"
    for seq in sched.running:
        assert bm.num_slots(seq.seq_id) >= seq.num_computed_tokens
        assert not seq.is_finished
        for g, table in enumerate(all_tables[seq.seq_id]):
            window = bm.group_windows[g]
            if window is None:
                assert len(table) == bm.blocks_needed(bm.num_slots(seq.seq_id))
            else:  # the computed tokens the next one's window reads have their blocks
                computed = bm.blocks_needed(seq.num_computed_tokens)
                first_read = max(0, seq.num_computed_tokens - window + 1) // bm.block_size
                assert len(table) >= computed and NULL_BLOCK not in table[first_read:computed]
                if bm.max_step_tokens is not None:  # held blocks stay within the quota
                    cap = bm.blocks_needed(window - 1 + bm.max_step_tokens) + 1
                    assert len(table) - table.count(NULL_BLOCK) <= cap
            # A cached block in a table names exactly the tokens the sequence has at that place.
            for i in range(min(seq.num_computed_tokens // bm.block_size, len(table))):
                h = None if table[i] == NULL_BLOCK else bm.block_hash(table[i])
                matches = h is None or h == seq.block_hashes[i]
                assert matches, "a cached block's hash does not match its content"
            for i in range(-(-seq.num_computed_tokens // bm.block_size), len(table)):
                assert bm.block_hash(table[i]) is None, "a block not computed yet is in the cache"
    for seq in sched.waiting:
        assert seq.status in (SequenceStatus.WAITING, SequenceStatus.PREEMPTED)
        assert seq.num_computed_tokens == 0
    # Waiting: preempted sequences first, then new ones; each group in arrival order.
    order = [(s.status is not SequenceStatus.PREEMPTED, s.arrival_time) for s in sched.waiting]
    assert order == sorted(order), "waiting queue out of order"
    arrivals = [s.arrival_time for s in sched.running]
    assert arrivals == sorted(arrivals), "running is not in arrival order"


@dataclass
class Request:
    prompt_len: int
    max_tokens: int
    arrival_step: int


@dataclass
class Abort:
    step: int
    request: int
    mid_step: bool  # after schedule(), before finish_step(): the batch still holds it


@dataclass
class RunResult:
    sched: Scheduler
    seqs: dict[int, Sequence] = field(default_factory=dict)
    rejected: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)
    batches: list[Batch] = field(default_factory=list)
    num_preemptions: int = 0
    num_waits: int = 0  # decodes left out of a batch because only in-flight sequences held the blocks
    num_in_flight_aborts: int = 0
    max_in_flight: int = 0


@dataclass(frozen=True)
class Before:
    """The scheduler's state just before a ``schedule`` call (sequences by id)."""

    running: list[str]
    in_flight: set[str]  # running sequences in in-flight batches
    decoding: list[str]  # running decodes not in flight: the ones a batch may hold
    had_work: bool
    num_in_flight_batches: int

    @classmethod
    def of(cls, sched: Scheduler) -> Before:
        return cls(
            running=[s.seq_id for s in sched.running],
            in_flight={s.seq_id for s in sched.running if sched.is_in_flight(s)},
            decoding=[s.seq_id for s in sched.running if not s.is_prefill and not sched.is_in_flight(s)],
            had_work=sched.has_unfinished(),
            num_in_flight_batches=sched.num_in_flight_batches,
        )


class PolicyChecker:
    """Checks one batch against the rules of the scheduler that made it."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.last_was_prefill = False
        self.recompute_target: dict[str, int] = {}  # preempted seq -> tokens its recompute must cover
        self.num_waits = 0  # decodes left out because only in-flight sequences could give them a block

    def _waits(self, seq_id: str, before: Before) -> bool:
        """Whether a running decode left out of the batch waits for blocks held by in-flight sequences.

        It must have no room for its next token while every running sequence newer than it was in flight
        (the not-in-flight ones would have been preempted first).
        """
        running = self.sched.running
        seq = next((s for s in running if s.seq_id == seq_id), None)
        if seq is None:
            return False
        newer = running[running.index(seq) + 1 :]
        return (
            bool(newer)
            and all(s.seq_id in before.in_flight for s in newer)
            and not self.sched.block_manager.can_append_slots(seq_id, seq.num_computed_tokens + 1)
        )

    def check(self, batch: Batch, before: Before) -> None:
        sched, cfg = self.sched, self.sched.config
        running_before, decoding_before = before.running, before.decoding
        ids = batch.seq_ids
        assert len(ids) == len(set(ids)), "a sequence appears twice in one batch"
        assert not set(ids) & before.in_flight, "an in-flight sequence was scheduled again"
        nothing_in_flight = before.num_in_flight_batches == 0
        assert not (before.had_work and nothing_in_flight) or not batch.is_empty, (
            "work left, nothing in flight, but nothing scheduled (deadlock)"
        )
        cap = cfg.max_num_seqs
        if sched.chunked_prefills:
            cap = min(cap, cfg.token_budget)  # so that all running decodes fit one iteration
        assert len(sched.running) <= cap
        preempted = {s.seq_id for s in batch.preempted}
        for entry in batch:
            seq = entry.seq
            assert not seq.is_finished and seq in sched.running
            assert seq.status is SequenceStatus.RUNNING
            assert sched.block_manager.num_slots(seq.seq_id) >= entry.end, "tokens scheduled without KV room"
            assert entry.samples == (entry.end == seq.num_tokens)
            if not entry.is_prefill:
                assert entry.num_tokens == 1
        for seq in batch.preempted:
            assert seq.seq_id not in before.in_flight, "an in-flight sequence was preempted"
            if seq.seq_id in ids:
                # Readmitted at once: only the prefix cache can make room it did not have before.
                assert sched.block_manager.enable_caching and seq in sched.running
            else:
                assert seq.num_computed_tokens == 0
                assert seq.status is SequenceStatus.PREEMPTED and seq in sched.waiting
            self.recompute_target[seq.seq_id] = seq.num_tokens
            assert seq.num_tokens == seq.num_prompt_tokens + seq.num_output_tokens
        for entry in batch:
            target = self.recompute_target.get(entry.seq.seq_id)
            if target is not None:
                assert entry.is_prefill and entry.end <= target
                if entry.start == 0:
                    assert entry.seq.num_computed_tokens == 0
                if entry.samples:
                    assert entry.end == target, "recompute must cover prompt + outputs"
                    del self.recompute_target[entry.seq.seq_id]

        prefills = [e for e in batch if e.is_prefill]
        # Admitted now: they start right after the prefix the cache gave them (whole blocks, never all).
        admitted = [e for e in batch if e.seq.seq_id not in running_before or e.seq in batch.preempted]
        bm = sched.block_manager
        if bm.enable_caching:
            assert all(e.start % bm.block_size == 0 and e.start < e.seq.num_tokens for e in admitted)
            assert batch.prefix_cache_hits == sum(e.start for e in admitted)
            assert batch.prefix_cache_queries == sum(e.seq.num_tokens for e in admitted)
        else:
            assert all(e.start == 0 for e in admitted)
            assert batch.prefix_cache_hits == batch.prefix_cache_queries == 0
        decodes = {e.seq.seq_id for e in batch if not e.is_prefill}
        left_out = [s for s in decoding_before if s not in decodes and s not in preempted]
        waits = {s for s in left_out if self._waits(s, before)}
        assert not waits or not nothing_in_flight
        all_decodes_in = all(s in decodes or s in preempted or s in waits for s in decoding_before)
        whole = all(e.samples and e in admitted for e in prefills)
        if sched.chunked_prefills:
            assert batch.num_tokens <= cfg.token_budget
            if cfg.chunk_schedule is not None:
                assert all(e.num_tokens <= cfg.chunk_schedule.chunk_size(e.start) for e in prefills)
        elif prefills:
            assert batch.num_tokens <= sched.max_num_batched_tokens
        else:
            assert batch.num_tokens <= cfg.max_num_seqs  # one token per running decode
        if cfg.name == "sarathi":
            assert all_decodes_in, "sarathi left out a running decode"
            self.num_waits += len(waits)
        elif cfg.name == "vllm":
            assert whole and (not prefills or not decodes)
            if not prefills:
                assert all_decodes_in
                self.num_waits += len(waits)
        elif cfg.name == "orca":
            assert whole and all_decodes_in and not batch.preempted and not waits
            assert not prefills or batch.num_tokens <= sched.max_num_batched_tokens
        elif cfg.name == "faster_transformer":
            assert whole and not batch.preempted and (not prefills or not decodes)
            if prefills:
                assert not running_before, "faster_transformer admitted while a batch was still running"
                assert nothing_in_flight, "faster_transformer admitted while a batch was in flight"
            else:
                assert set(running_before) - before.in_flight == decodes
        elif cfg.name == "simple_chunking":
            assert not (prefills and decodes), "simple_chunking mixed prefills and decodes"
            blocked = preempted | waits
            if self.last_was_prefill and decoding_before and not all(s in blocked for s in decoding_before):
                assert not prefills, "simple_chunking ran two prefill iterations while sequences decode"
            if not prefills:
                assert all_decodes_in
            self.num_waits += len(waits)
            if not batch.is_empty:  # everything in flight: the turn does not pass
                self.last_was_prefill = bool(prefills)


def run_workload(
    sched: Scheduler, requests: list[Request], aborts: list[Abort], max_steps: int = 20_000, depth: int = 1
) -> RunResult:
    """Drive ``sched`` to completion with the fake model, checking every invariant at every step.

    A step schedules until ``depth`` batches are in flight (pipeline parallelism; 1 is the plain
    schedule-then-finish loop) or a batch comes back empty, then finishes the oldest in-flight batch.
    Mid-step aborts come after the scheduling, so they hit sequences in flight as well as waiting ones.
    """
    result = RunResult(sched)
    checker = PolicyChecker(sched)
    pipeline = Pipeline(sched, depth)
    max_model_len = sched.max_model_len
    pending = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_step, i))
    outputs_seen: dict[str, int] = {}
    step_no = 0
    while pending or sched.has_unfinished() or pipeline.in_flight:
        assert step_no < max_steps, "no progress: the scheduler livelocked"
        now = float(step_no)
        while pending and requests[pending[0]].arrival_step <= step_no:
            i = pending.pop(0)
            r = requests[i]
            seq = make_seq(f"r{i}", r.prompt_len, r.max_tokens, arrival=now, max_model_len=max_model_len)
            should_reject = not sched.chunked_prefills and seq.max_num_tokens > sched.max_num_batched_tokens
            try:
                sched.add_sequence(seq)
            except ValueError:
                assert should_reject
                result.rejected.add(i)
                continue
            assert not should_reject
            result.seqs[i] = seq

        def do_aborts(mid: bool, now: float = now, step_no: int = step_no) -> None:
            for a in aborts:
                seq = result.seqs.get(a.request)
                if a.step == step_no and a.mid_step == mid and seq is not None and not seq.is_finished:
                    in_flight = sched.is_in_flight(seq)
                    assert sched.abort_sequence(seq.seq_id, now) is seq
                    assert seq.status is SequenceStatus.FINISHED_ABORTED
                    assert not sched.block_manager.has_blocks(seq.seq_id), "abort kept the blocks"
                    result.aborted.add(a.request)
                    result.num_in_flight_aborts += in_flight

        do_aborts(mid=False)
        check_blocks(sched)
        pipeline.check()
        while len(pipeline.in_flight) < depth:
            before = Before.of(sched)
            batch = pipeline.schedule(now)
            checker.check(batch, before)
            check_blocks(sched)
            pipeline.check()
            result.num_preemptions += len(batch.preempted)
            result.batches.append(batch)
            result.max_in_flight = max(result.max_in_flight, len(pipeline.in_flight))
            if batch.is_empty:
                break
        do_aborts(mid=True)
        pipeline.check()
        if pipeline.in_flight:
            oldest = pipeline.in_flight[0]
            finished = pipeline.finish_oldest(now)
            for seq in finished:
                assert seq.is_finished and seq not in sched.running
                assert not sched.block_manager.has_blocks(seq.seq_id)
            assert not any(sched.is_in_flight(e.seq) for e in oldest)
        for seq in result.seqs.values():
            assert seq.num_output_tokens >= outputs_seen.get(seq.seq_id, 0), "outputs were lost"
            outputs_seen[seq.seq_id] = seq.num_output_tokens
        check_blocks(sched)
        pipeline.check()
        step_no += 1

    result.num_waits = checker.num_waits
    assert sched.num_in_flight_batches == 0
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm.seq_ids, "blocks leaked"
    for i, seq in result.seqs.items():
        if i in result.aborted:
            assert seq.status is SequenceStatus.FINISHED_ABORTED
            continue
        r = requests[i]
        expected = min(r.max_tokens, max(max_model_len - r.prompt_len, 1))
        assert seq.status is SequenceStatus.FINISHED_LENGTH
        assert seq.num_output_tokens == expected
        assert seq.output_token_ids == [FAKE_TOKEN] * expected
    return result
