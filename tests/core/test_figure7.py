"""The paper's Figure 7: A and B are decoding when C and D arrive with long prompts.

Each policy is driven iteration by iteration with the fake model and its batches are compared with what
the paper describes for it.
"""

from __future__ import annotations

from sarathi.config import ChunkSchedule
from sarathi.core.batch import Batch
from sarathi.core.sequence import Sequence

from .sim import build, check_blocks, decode_ids, make_seq, prefill_chunks, step

BUDGET = 128
C_LEN, D_LEN = 250, 300


def figure7(name: str, **config: object) -> tuple[dict[str, Sequence], list[Batch]]:
    """Run A and B into decode, add C and D, run to completion; return the batches after C and D came."""
    sched = build(name, token_budget=BUDGET, **config)
    seqs = {"A": make_seq("A", 16, 12), "B": make_seq("B", 24, 12)}
    for seq in seqs.values():
        sched.add_sequence(seq)
    for _ in range(3):
        step(sched)
    assert all(not s.is_prefill and s.num_output_tokens == 3 for s in seqs.values())
    seqs |= {"C": make_seq("C", C_LEN, 4, arrival=1.0), "D": make_seq("D", D_LEN, 4, arrival=1.0)}
    sched.add_sequence(seqs["C"])
    sched.add_sequence(seqs["D"])
    batches = []
    while sched.has_unfinished():
        assert len(batches) < 100
        batch, _ = step(sched, now=1.0 + len(batches))
        check_blocks(sched)
        assert not batch.preempted
        batches.append(batch)
    assert all(s.num_output_tokens == s.sampling_params.max_tokens for s in seqs.values())
    return seqs, batches


def test_sarathi_piggybacks_chunks_on_decodes_without_stalls() -> None:
    seqs, batches = figure7("sarathi")
    assert [prefill_chunks(b) for b in batches[:5]] == [
        [("C", 126)],
        [("C", 124), ("D", 2)],  # C's last chunk leaves 2 tokens of budget: D starts right away
        [("D", 125)],  # C now decodes too: 3 decodes + 125 = 128
        [("D", 125)],
        [("D", 48)],
    ]
    assert decode_ids(batches[0]) == {"A", "B"}
    assert decode_ids(batches[2]) == {"A", "B", "C"}
    for batch in batches:
        assert batch.num_tokens <= BUDGET
    # No generation stall: A and B get a token in every iteration until they finish.
    for name in ("A", "B"):
        seq = seqs[name]
        n_left = seq.sampling_params.max_tokens - 3
        assert all(name in decode_ids(b) for b in batches[:n_left])


def test_vllm_runs_c_and_d_prefill_only_and_stalls_decodes() -> None:
    _, batches = figure7("vllm")
    first = batches[0]
    assert prefill_chunks(first) == [("C", C_LEN), ("D", D_LEN)]
    assert decode_ids(first) == set(), "A and B stall while C and D prefill"
    assert decode_ids(batches[1]) == {"A", "B", "C", "D"}
    assert all(not prefill_chunks(b) for b in batches[1:])


def test_orca_mixes_whole_prompts_with_decodes() -> None:
    _, batches = figure7("orca")
    first = batches[0]
    assert decode_ids(first) == {"A", "B"}
    assert prefill_chunks(first) == [("C", C_LEN), ("D", D_LEN)]
    assert first.num_tokens == 2 + C_LEN + D_LEN
    assert all(not prefill_chunks(b) for b in batches[1:])


def test_faster_transformer_admits_c_and_d_only_after_a_and_b_finish() -> None:
    seqs, batches = figure7("faster_transformer")
    n_left = 12 - 3
    for batch in batches[:n_left]:
        assert decode_ids(batch) == {"A", "B"} and not prefill_chunks(batch)
    # Both finished in the last of those iterations.
    assert seqs["A"].finished_time == seqs["B"].finished_time == float(n_left)
    assert prefill_chunks(batches[n_left]) == [("C", C_LEN), ("D", D_LEN)]
    assert decode_ids(batches[n_left]) == set()
    for batch in batches[n_left + 1 :]:
        assert decode_ids(batch) == {"C", "D"}


def test_simple_chunking_alternates_prefill_only_and_decode_only() -> None:
    _, batches = figure7("simple_chunking")
    kinds = ["P" if prefill_chunks(b) else "D" for b in batches]
    assert all(not (prefill_chunks(b) and decode_ids(b)) for b in batches)
    assert "".join(kinds[:10]) == "PDPDPDPDPD"
    assert [prefill_chunks(b) for b in batches[0:10:2]] == [
        [("C", 128)],
        [("C", 122), ("D", 6)],
        [("D", 128)],
        [("D", 128)],
        [("D", 38)],
    ]
    assert decode_ids(batches[1]) == {"A", "B"}
    assert decode_ids(batches[3]) == {"A", "B", "C"}
    assert all(b.num_tokens <= BUDGET for b in batches)


def test_dynamic_chunk_schedule_shrinks_chunks_of_a_lone_prompt() -> None:
    schedule = ChunkSchedule(low_chunk_size=32, high_chunk_size=128, num_stages=4, tokens_per_stage=128)
    assert schedule.chunk_sizes == [128, 96, 64, 32]
    sched = build("sarathi", token_budget=256, chunk_schedule=schedule)
    sched.add_sequence(make_seq("P", 500, 1))
    chunks = []
    while sched.has_unfinished():
        batch, _ = step(sched)
        chunks += [n for _, n in prefill_chunks(batch)]
    # computed 0 -> 128 -> 224 -> 320 -> 384 -> 416 -> 448 -> 480 -> 500
    assert chunks == [128, 96, 96, 64, 32, 32, 32, 20]


def test_dynamic_chunk_schedule_with_piggybacked_decodes() -> None:
    schedule = ChunkSchedule(low_chunk_size=32, high_chunk_size=128, num_stages=4, tokens_per_stage=64)
    _, batches = figure7("sarathi", chunk_schedule=schedule)
    # A chunk of a prompt with p tokens computed is at most sizes[p // 64] minus what the batch holds.
    assert [prefill_chunks(b) for b in batches[:7]] == [
        [("C", 126)],  # C at 0: 128 - 2 decodes; D would get 0 tokens, so it waits
        [("C", 94), ("D", 32)],  # C at 126: 96 - 2; D at 0: 128 - 96
        [("C", 30), ("D", 96)],  # C at 220: 32 - 2 finishes C's prompt; D at 32: 128 - 32
        [("D", 61)],  # D at 128: 64 - 3 decodes (C decodes now)
        [("D", 61)],  # D at 189: 64 - 3
        [("D", 29)],  # D at 250: 32 - 3
        [("D", 21)],  # D at 279: the last 21 tokens
    ]
    assert all(decode_ids(b) >= {"A", "B"} for b in batches[:7])
