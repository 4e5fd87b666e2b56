"""Scheduler API: request checks, the registry, aborts, engine-side stops and preemption."""

from __future__ import annotations

import pytest

from sarathi.config import SCHEDULER_NAMES, ChunkSchedule, SchedulerConfig
from sarathi.core.block_manager import BlockManager
from sarathi.core.schedulers import SCHEDULERS, make_scheduler
from sarathi.core.sequence import SequenceStatus

from .sim import FAKE_TOKEN, build, check_blocks, make_seq, prefill_chunks, step

WHOLE_PROMPT = ("vllm", "orca", "faster_transformer")
CHUNKED = ("sarathi", "simple_chunking")


def test_registry_covers_every_configurable_name() -> None:
    assert set(SCHEDULERS) == set(SCHEDULER_NAMES)
    for name in SCHEDULER_NAMES:
        assert isinstance(build(name), SCHEDULERS[name])


def test_unknown_scheduler_name_lists_the_choices() -> None:
    config = SchedulerConfig()
    object.__setattr__(config, "name", "fcfs")  # SchedulerConfig itself rejects unknown names
    with pytest.raises(ValueError, match="fcfs") as err:
        make_scheduler(config, BlockManager(8, 4), 64)
    for name in SCHEDULER_NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_prompt_longer_than_max_model_len_is_rejected(name: str) -> None:
    sched = build(name, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len=64"):
        sched.add_sequence(make_seq("x", 65, 1, max_model_len=64))
    sched.add_sequence(make_seq("ok", 64, 1, max_model_len=64))
    assert sched.num_waiting == 1


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_request_larger_than_the_cache_is_rejected(name: str) -> None:
    sched = build(name, num_blocks=10, block_size=4, watermark=0.1, max_model_len=100)  # 9 admissible blocks
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add_sequence(make_seq("x", 30, 7, max_model_len=100))  # 37 tokens: 10 blocks
    sched.add_sequence(make_seq("ok", 30, 6, max_model_len=100))  # 36 tokens: 9 blocks
    assert [s.seq_id for s in sched.waiting] == ["ok"]


@pytest.mark.parametrize("name", WHOLE_PROMPT)
def test_whole_prompt_policies_reject_requests_over_max_num_batched_tokens(name: str) -> None:
    sched = build(name, max_num_batched_tokens=32, max_model_len=100)
    with pytest.raises(ValueError, match="max_num_batched_tokens=32"):
        sched.add_sequence(make_seq("x", 20, 13, max_model_len=100))  # could recompute 32+ tokens
    sched.add_sequence(make_seq("ok", 20, 12, max_model_len=100))


@pytest.mark.parametrize("name", CHUNKED)
def test_chunked_policies_split_requests_over_max_num_batched_tokens(name: str) -> None:
    sched = build(name, max_num_batched_tokens=32, token_budget=16, max_model_len=100)
    sched.add_sequence(make_seq("long", 50, 2, max_model_len=100))
    batch, _ = step(sched)
    assert prefill_chunks(batch) == [("long", 16)]


def test_duplicate_request_id_is_rejected() -> None:
    sched = build("sarathi")
    sched.add_sequence(make_seq("a", 4, 2))
    with pytest.raises(ValueError, match="already"):
        sched.add_sequence(make_seq("a", 4, 2))


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_abort_from_waiting_and_running_frees_blocks(name: str) -> None:
    sched = build(name, max_num_seqs=1)
    a, b = make_seq("a", 20, 5), make_seq("b", 20, 5)
    sched.add_sequence(a)
    sched.add_sequence(b)
    step(sched)
    assert sched.running == [a] and list(sched.waiting) == [b]
    assert sched.abort_sequence("b", 1.0) is b and b.status is SequenceStatus.FINISHED_ABORTED
    assert sched.abort_sequence("a", 1.0) is a and a.finished_time == 1.0
    assert sched.abort_sequence("a", 2.0) is None
    assert sched.abort_sequence("nope", 2.0) is None
    assert not sched.has_unfinished() and sched.block_manager.num_used_blocks == 0


def test_abort_while_the_batch_runs_is_skipped_by_finish_step() -> None:
    sched = build("sarathi")
    a, b = make_seq("a", 8, 5), make_seq("b", 8, 5)
    sched.add_sequence(a)
    sched.add_sequence(b)
    batch = sched.schedule(0.0)
    sched.abort_sequence("a", 0.5)
    finished = sched.finish_step(batch, {"a": FAKE_TOKEN, "b": FAKE_TOKEN}, 1.0)
    assert finished == [] and a.num_output_tokens == 0 and b.num_output_tokens == 1
    assert sched.running == [b]
    check_blocks(sched)


def test_finish_sequence_for_an_engine_detected_stop() -> None:
    sched = build("sarathi")
    a = make_seq("a", 8, 5)
    sched.add_sequence(a)
    step(sched)
    sched.finish_sequence(a, SequenceStatus.FINISHED_STOPPED, 1.0, stop_reason="###")
    assert a.status is SequenceStatus.FINISHED_STOPPED and a.stop_reason == "###"
    assert not sched.has_unfinished() and sched.block_manager.num_used_blocks == 0
    sched.finish_sequence(a, SequenceStatus.FINISHED_ABORTED, 2.0)  # already finished: no-op
    assert a.status is SequenceStatus.FINISHED_STOPPED


def test_eos_finishes_a_sequence_unless_ignored() -> None:
    sched = build("sarathi")
    stops, runs_on = make_seq("stops", 8, 5, ignore_eos=False), make_seq("runs_on", 8, 5)
    sched.add_sequence(stops)
    sched.add_sequence(runs_on)
    _, finished = step(sched)
    assert finished == [stops] and stops.status is SequenceStatus.FINISHED_STOPPED
    assert sched.running == [runs_on]


def test_finish_step_rejects_a_stale_batch() -> None:
    sched = build("sarathi")
    sched.add_sequence(make_seq("a", 8, 5))
    batch = sched.schedule(0.0)
    sched.finish_step(batch, {"a": FAKE_TOKEN}, 0.0)
    with pytest.raises(RuntimeError, match="stale"):
        sched.finish_step(batch, {"a": FAKE_TOKEN}, 0.0)


def test_sarathi_caps_running_at_the_token_budget() -> None:
    sched = build("sarathi", token_budget=3, max_num_seqs=8)
    assert sched.max_running == 3
    for i in range(5):
        sched.add_sequence(make_seq(f"s{i}", 1, 4))
    batch, _ = step(sched)
    assert batch.seq_ids == ["s0", "s1", "s2"] and sched.num_waiting == 2
    batch, _ = step(sched)
    assert batch.num_decode_tokens == 3 and batch.num_tokens == 3


def test_preemption_picks_the_newest_running_sequence() -> None:
    # 6 blocks of 4 tokens: A (8) + B (8) + C (4) fill 5; growing A takes the 6th, growing B needs C's.
    sched = build("sarathi", num_blocks=6, block_size=4, token_budget=64, max_model_len=24)
    a, b, c = (make_seq(n, p, 20, t, max_model_len=24) for n, p, t in [("A", 8, 0), ("B", 8, 1), ("C", 4, 2)])
    for seq in (a, b, c):
        sched.add_sequence(seq)
    step(sched)
    batch, _ = step(sched)
    assert batch.seq_ids == ["A", "B"] and batch.preempted == [c]
    assert c.status is SequenceStatus.PREEMPTED and c.num_computed_tokens == 0
    assert c.output_token_ids == [FAKE_TOKEN], "outputs survive preemption"
    assert list(sched.waiting) == [c] and sched.running == [a, b]
    check_blocks(sched)


def test_a_decode_that_is_the_newest_preempts_itself() -> None:
    sched = build("vllm", num_blocks=4, block_size=4)
    a, b = make_seq("A", 7, 2, 0.0), make_seq("B", 8, 3, 1.0)
    sched.add_sequence(a)
    sched.add_sequence(b)
    step(sched)  # A: 8 tokens (fits its 2 blocks), B: 9 tokens (needs a 3rd block, none free)
    batch, finished = step(sched)
    assert batch.seq_ids == ["A"] and batch.preempted == [b] and finished == [a]
    # B recomputes prompt + its output as one prefill.
    batch, _ = step(sched)
    (entry,) = batch.entries
    assert (entry.seq, entry.start, entry.num_tokens) == (b, 0, 9)
    assert entry.is_prefill and entry.samples
    assert b.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN]


def test_a_partial_prefill_not_yet_in_the_batch_can_be_the_victim() -> None:
    sched = build("sarathi", num_blocks=6, block_size=4, token_budget=8)
    a, b = make_seq("A", 7, 10, 0.0), make_seq("B", 16, 2, 1.0)
    sched.add_sequence(a)
    step(sched)  # A prefills 7 tokens: 2 blocks
    sched.add_sequence(b)
    batch, _ = step(sched)  # A decodes in its 2 blocks; B takes the other 4 and prefills 7
    assert prefill_chunks(batch) == [("B", 7)] and sched.block_manager.num_free_blocks == 0
    batch, _ = step(sched)  # A needs a 3rd block: B loses its 7 computed tokens
    assert batch.seq_ids == ["A"] and batch.preempted == [b]
    assert b.num_computed_tokens == 0 and list(sched.waiting) == [b]


def test_preempted_sequences_requeue_in_arrival_order_ahead_of_new_ones() -> None:
    sched = build("sarathi", num_blocks=3, block_size=2, token_budget=64, max_model_len=6)
    seqs = [make_seq(f"s{i}", 2, 10, float(i), max_model_len=6) for i in range(3)]
    for seq in seqs:
        sched.add_sequence(seq)
    step(sched)  # each prefilled into its one block; each now needs a second
    late = make_seq("late", 1, 1, 9.0, max_model_len=6)
    sched.add_sequence(late)
    batch, _ = step(sched)  # s0 preempts s2, then s1 preempts itself
    assert batch.seq_ids == ["s0"] and batch.preempted == [seqs[2], seqs[1]]
    assert [s.seq_id for s in sched.waiting] == ["s1", "s2", "late"]


def test_max_num_batched_tokens_defaults_to_max_model_len() -> None:
    assert make_scheduler(SchedulerConfig(name="orca"), BlockManager(16, 4), 32).max_num_batched_tokens == 32
    config = SchedulerConfig(name="orca", max_num_batched_tokens=20)
    assert make_scheduler(config, BlockManager(16, 4), 32).max_num_batched_tokens == 20


def test_simple_chunking_prefills_when_its_decode_turn_preempted_every_decode() -> None:
    # B (newest) decodes while A, older, is mid-prefill and holds most blocks: B's decode preempts B
    # itself, and the iteration must then advance A's prefill rather than come back empty.
    schedule = ChunkSchedule(low_chunk_size=1, high_chunk_size=2, num_stages=2, tokens_per_stage=1)
    sched = build(
        "simple_chunking",
        num_blocks=5,
        block_size=1,
        max_model_len=4,
        token_budget=2,
        chunk_schedule=schedule,
    )
    a, b = make_seq("A", 4, 1, 0.0, max_model_len=4), make_seq("B", 1, 2, 0.0, max_model_len=4)
    sched.add_sequence(a)
    sched.add_sequence(b)
    assert prefill_chunks(step(sched)[0]) == [("A", 2)]
    assert prefill_chunks(step(sched)[0]) == [("A", 1), ("B", 1)]
    batch, _ = step(sched)
    assert batch.preempted == [b] and prefill_chunks(batch) == [("A", 1)]
    assert prefill_chunks(step(sched)[0]) == [("B", 2)]  # recompute of prompt + output
