"""Pipeline parallelism: ``schedule`` runs again while up to N earlier batches are still in flight.

``run_workload(..., depth=N)`` (see sim.py) checks at every call that no sequence is in two in-flight
batches, that in-flight sequences are never preempted and keep their KV, each policy's batching rules
and budgets, and that every request ends with exactly its expected outputs and no blocks leak.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarathi.config import SCHEDULER_NAMES
from sarathi.core.batch import Batch
from sarathi.core.sequence import Sequence, SequenceStatus

from .sim import (
    FAKE_TOKEN,
    Abort,
    Pipeline,
    Request,
    build,
    check_blocks,
    decode_ids,
    fake_tokens,
    make_seq,
    prefill_chunks,
    run_workload,
    step,
)
from .test_scheduler_properties import PROPERTY_SETTINGS, setups, workloads

DEPTHS = (1, 2, 4)
# Mixed prompt lengths and staggered arrivals; 32 blocks of 4 tokens are too few for all of them at once,
# so the policies that can preempt do.
MIXED = [Request(prompt_len=6 + 13 * i % 37, max_tokens=4 + i % 9, arrival_step=i // 4) for i in range(16)]


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_workload_runs_to_completion_with_batches_in_flight(name: str, depth: int) -> None:
    sched = build(name, num_blocks=32, block_size=4, max_model_len=64, token_budget=16, max_num_seqs=6)
    result = run_workload(sched, MIXED, [], max_steps=2_000, depth=depth)
    assert not result.rejected and len(result.seqs) == len(MIXED)
    assert sched.block_manager.num_used_blocks == 0 and sched.num_in_flight_batches == 0
    if name == "faster_transformer":  # it always schedules its whole running batch
        assert result.max_in_flight == 1
    else:
        assert result.max_in_flight == 1 if depth == 1 else 1 < result.max_in_flight <= depth
    if name in ("sarathi", "vllm", "simple_chunking"):
        assert result.num_preemptions > 0


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_pipelined_workloads_run_to_completion(name: str, data: st.DataObject) -> None:
    setup = data.draw(setups(name))
    requests, aborts = data.draw(workloads(setup["max_model_len"]))
    # Early mid-step aborts: they mostly hit sequences in flight (or waiting behind them).
    aborts += data.draw(
        st.lists(
            st.builds(
                Abort,
                step=st.integers(0, 20),
                request=st.integers(0, len(requests) - 1),
                mid_step=st.just(True),
            ),
            max_size=3,
        )
    )
    depth = data.draw(st.sampled_from([1, 2, 2, 3, 4, 4]))
    run_workload(build(**setup), requests, aborts, depth=depth)


def test_two_sliding_groups_agree_on_a_prefix_hit() -> None:
    # The example the property test above found: the second sliding group shortened the first's hit, whose
    # window at the shorter hit was no longer cached, and admission raised a KeyError.
    setup = {
        "group_windows": (2, 2, None),
        "num_blocks": 72,
        "block_size": 2,
        "watermark": 0.0,
        "max_model_len": 47,
        "token_budget": 1,
        "max_num_seqs": 1,
        "max_num_batched_tokens": None,
        "chunk_schedule": None,
        "enable_caching": True,
    }
    requests = [
        Request(prompt_len=5, max_tokens=1, arrival_step=4),
        Request(prompt_len=6, max_tokens=11, arrival_step=2),
        Request(prompt_len=15, max_tokens=3, arrival_step=1),
        Request(prompt_len=16, max_tokens=22, arrival_step=3),
        Request(prompt_len=23, max_tokens=24, arrival_step=0),
        Request(prompt_len=2, max_tokens=7, arrival_step=2),
    ]
    run_workload(build("vllm", **setup), requests, [], depth=1)


@pytest.mark.parametrize("name", ["sarathi", "vllm", "simple_chunking"])
def test_tight_caches_make_decodes_wait_for_in_flight_sequences(name: str) -> None:
    """Guard against the pipelined runs never exercising waits, preemption or in-flight aborts."""
    sched = build(name, num_blocks=32, block_size=4, max_model_len=64, token_budget=16, max_num_seqs=6)
    aborts = [Abort(step=5 + 3 * k, request=2 * k + 1, mid_step=True) for k in range(5)]
    result = run_workload(sched, MIXED, aborts, depth=4)
    assert result.num_preemptions > 0 and result.num_waits > 0
    assert result.num_in_flight_aborts > 0


# --- the in-flight bookkeeping --------------------------------------------------------------------------
def test_in_flight_sequences_are_skipped_until_their_batch_finishes() -> None:
    sched = build("sarathi")
    a = make_seq("a", 8, 3)
    sched.add_sequence(a)
    first = sched.schedule(0.0)
    assert first.seq_ids == ["a"] and sched.is_in_flight(a) and sched.num_in_flight_batches == 1
    second = sched.schedule(0.0)
    assert second.is_empty and sched.num_in_flight_batches == 1, "an empty batch is not in flight"
    assert sched.finish_step(second, {}, 0.0) == []
    sched.finish_step(first, fake_tokens(first), 0.0)
    assert not sched.is_in_flight(a) and sched.num_in_flight_batches == 0
    assert sched.schedule(0.0).seq_ids == ["a"]


def test_batches_must_finish_in_the_order_they_were_scheduled() -> None:
    sched = build("sarathi")
    sched.add_sequence(make_seq("a", 8, 3))
    first = sched.schedule(0.0)
    sched.add_sequence(make_seq("b", 8, 3))
    second = sched.schedule(0.0)
    assert second.seq_ids == ["b"]
    with pytest.raises(RuntimeError, match="stale"):
        sched.finish_step(second, fake_tokens(second), 0.0)
    sched.finish_step(first, fake_tokens(first), 0.0)
    sched.finish_step(second, fake_tokens(second), 0.0)
    with pytest.raises(RuntimeError, match="stale"):
        sched.finish_step(second, fake_tokens(second), 0.0)


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_abort_in_flight_frees_blocks_at_once_and_finish_step_skips_it(name: str) -> None:
    sched = build(name)
    a, b = make_seq("a", 8, 5), make_seq("b", 8, 5)
    sched.add_sequence(a)
    first = sched.schedule(0.0)
    sched.add_sequence(b)
    second = sched.schedule(0.0)
    assert second.seq_ids == ([] if name == "faster_transformer" else ["b"])
    assert sched.abort_sequence("a", 0.5) is a and a.status is SequenceStatus.FINISHED_ABORTED
    assert not sched.block_manager.has_blocks("a") and a not in sched.running
    assert sched.is_in_flight(a), "still in its batch until that finishes"
    assert sched.finish_step(first, fake_tokens(first), 1.0) == []
    assert a.num_output_tokens == 0 and not sched.is_in_flight(a)
    sched.finish_step(second, fake_tokens(second), 1.0)
    while sched.has_unfinished():
        batch, _ = step(sched)
        assert "a" not in batch.seq_ids
    assert b.num_output_tokens == 5 and sched.block_manager.num_used_blocks == 0


def test_finish_sequence_of_an_in_flight_sequence() -> None:
    sched = build("orca")
    a = make_seq("a", 8, 5)
    sched.add_sequence(a)
    step(sched)
    batch = sched.schedule(1.0)
    sched.finish_sequence(a, SequenceStatus.FINISHED_STOPPED, 1.5, stop_reason="###")
    assert sched.block_manager.num_used_blocks == 0 and not sched.has_unfinished()
    assert sched.finish_step(batch, fake_tokens(batch), 2.0) == []
    assert a.output_token_ids == [FAKE_TOKEN] and sched.num_in_flight_batches == 0


def test_a_request_id_reused_while_the_aborted_one_is_in_flight() -> None:
    sched = build("sarathi")
    old = make_seq("x", 8, 5)
    sched.add_sequence(old)
    first = sched.schedule(0.0)
    sched.abort_sequence("x", 0.0)
    new = make_seq("x", 4, 2)
    sched.add_sequence(new)
    second = sched.schedule(0.0)
    assert [e.seq for e in second] == [new]
    sched.finish_step(first, fake_tokens(first), 0.0)
    assert sched.is_in_flight(new), "finishing the old batch must not release the new sequence"
    assert sched.schedule(0.0).is_empty
    sched.finish_step(second, fake_tokens(second), 0.0)
    assert new.num_output_tokens == 1 and old.num_output_tokens == 0


def test_faster_transformer_admits_only_when_no_batch_is_in_flight() -> None:
    sched = build("faster_transformer")
    a, b = make_seq("a", 8, 5), make_seq("b", 8, 5)
    sched.add_sequence(a)
    batch = sched.schedule(0.0)
    sched.add_sequence(b)
    sched.abort_sequence("a", 0.0)
    assert not sched.running and sched.schedule(0.0).is_empty, "a's batch is still in flight"
    sched.finish_step(batch, fake_tokens(batch), 0.0)
    assert sched.schedule(0.0).seq_ids == ["b"]


def test_simple_chunking_alternates_between_two_micro_batches_in_flight() -> None:
    # A decodes when B's long prompt arrives: A's decodes and B's chunks take turns, one of each in flight.
    sched = build("simple_chunking", token_budget=16)
    a, b = make_seq("A", 4, 20), make_seq("B", 64, 2)
    sched.add_sequence(a)
    step(sched)
    sched.add_sequence(b)
    pipe = Pipeline(sched, depth=2)
    batches: list[Batch] = []
    while len(batches) < 10:
        batches += pipe.fill()
        pipe.finish_oldest()
    assert [prefill_chunks(b) or sorted(decode_ids(b)) for b in batches[:10]] == [
        ["A"],
        [("B", 16)],
        ["A"],
        [("B", 16)],
        ["A"],
        [("B", 16)],
        ["A"],
        [("B", 16)],
        ["A"],
        ["B"],  # B's prompt is done: both decode, each in its own micro-batch
    ]


# --- preemption never picks an in-flight victim ---------------------------------------------------------
def test_a_decode_waits_rather_than_preempt_a_newer_in_flight_sequence() -> None:
    # 4 blocks of 4 tokens. A (7-token prompt) decodes in flight while B (8 tokens) is admitted into the
    # last 2 blocks; A then needs a 3rd block, and B, the only newer sequence, is in flight.
    sched = build("sarathi", num_blocks=4, block_size=4, token_budget=64)
    a, b = make_seq("A", 7, 4, 0.0), make_seq("B", 8, 4, 1.0)
    sched.add_sequence(a)
    step(sched)
    pipe = Pipeline(sched, depth=2)
    assert pipe.schedule().seq_ids == ["A"]
    sched.add_sequence(b)
    assert pipe.schedule().seq_ids == ["B"] and sched.block_manager.num_free_blocks == 0
    pipe.finish_oldest()
    waiting = pipe.schedule()
    assert waiting.is_empty and not waiting.preempted, "A waits; B is not preempted in flight"
    assert a.status is SequenceStatus.RUNNING and a.num_computed_tokens == 8
    pipe.finish_oldest()
    batch = pipe.schedule()
    assert batch.seq_ids == ["A"] and batch.preempted == [b], "B is the victim once out of flight"
    check_blocks(sched)


def test_the_newest_victim_not_in_flight_is_preempted() -> None:
    # 4 blocks of 4 tokens: A (2 blocks) and B (1) decode in flight while C (1) is admitted. A then needs
    # a 3rd block: C, the newest, is in flight, so B is preempted.
    sched = build("sarathi", num_blocks=4, block_size=4, token_budget=64)
    a, b, c = make_seq("A", 7, 4, 0.0), make_seq("B", 3, 4, 0.5), make_seq("C", 3, 4, 1.0)
    sched.add_sequence(a)
    sched.add_sequence(b)
    step(sched)
    pipe = Pipeline(sched, depth=2)
    assert pipe.schedule().seq_ids == ["A", "B"]
    sched.add_sequence(c)
    assert pipe.schedule().seq_ids == ["C"] and sched.block_manager.num_free_blocks == 0
    pipe.finish_oldest()
    batch = pipe.schedule()
    assert batch.seq_ids == ["A"] and batch.preempted == [b]
    assert sched.is_in_flight(c) and c.status is SequenceStatus.RUNNING
    check_blocks(sched)


# --- Figure 7 under two micro-batches in flight ---------------------------------------------------------
BUDGET = 128
C_LEN, D_LEN = 250, 300


def figure7_pipelined(name: str, depth: int) -> tuple[dict[str, Sequence], list[tuple[Batch, set[str]]]]:
    """Figure 7 with ``depth`` batches in flight: A and B decode when C and D arrive with long prompts.

    Returns every micro-batch after C and D came, each with the decodes it could have held (running,
    decoding, not in flight).
    """
    sched = build(name, token_budget=BUDGET)
    seqs = {"A": make_seq("A", 16, 12), "B": make_seq("B", 24, 12)}
    for seq in seqs.values():
        sched.add_sequence(seq)
    for _ in range(3):
        step(sched)
    seqs |= {"C": make_seq("C", C_LEN, 4, arrival=1.0), "D": make_seq("D", D_LEN, 4, arrival=1.0)}
    sched.add_sequence(seqs["C"])
    sched.add_sequence(seqs["D"])
    pipe = Pipeline(sched, depth)
    batches = []
    while sched.has_unfinished():
        assert len(batches) < 200
        while len(pipe.in_flight) < depth:
            available = {s.seq_id for s in sched.running if not s.is_prefill and not sched.is_in_flight(s)}
            batch = pipe.schedule()
            assert not batch.preempted
            batches.append((batch, available))
            if batch.is_empty:
                break
        pipe.finish_oldest()
        check_blocks(sched)
    assert all(s.num_output_tokens == s.sampling_params.max_tokens for s in seqs.values())
    return seqs, batches


def test_sarathi_never_leaves_an_available_decode_out_of_a_micro_batch() -> None:
    _, batches = figure7_pipelined("sarathi", depth=2)
    assert all(available <= decode_ids(batch) for batch, available in batches)
    assert all(batch.num_tokens <= BUDGET for batch, _ in batches)
    # C and D's chunks fill the micro-batches A and B are not in, so both pipeline stages stay busy.
    assert [prefill_chunks(b) for b, _ in batches[:4]] == [
        [("C", 126)],
        [("D", 128)],
        [("C", 124)],
        [("D", 128)],
    ]
    assert [decode_ids(b) for b, _ in batches[:4]] == [{"A", "B"}, set(), {"A", "B"}, set()]
    # A and B get a token every depth micro-batches: no generation stall.
    for name in ("A", "B"):
        slots = [i for i, (b, _) in enumerate(batches) if name in decode_ids(b)]
        assert all(j - i <= 2 for i, j in itertools.pairwise(slots))


def test_vllm_stalls_available_decodes_behind_prefill_micro_batches() -> None:
    _, batches = figure7_pipelined("vllm", depth=2)
    first, available = batches[0]
    assert prefill_chunks(first) == [("C", C_LEN), ("D", D_LEN)]
    assert available == {"A", "B"} and decode_ids(first) == set(), "A and B stall while C and D prefill"
    assert decode_ids(batches[1][0]) == {"A", "B"}
