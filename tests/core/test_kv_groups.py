"""KV-cache groups: how layers are grouped, and a block manager whose sliding groups drop old blocks."""

from __future__ import annotations

import pytest

from sarathi.core.block_hash import BlockHash
from sarathi.core.block_manager import NULL_BLOCK, BlockManager, BlockManagerError
from sarathi.core.kv_groups import KVCacheGroup, kv_cache_groups, layer_slots

from .sim import build, make_seq, step

GEMMA3_270M = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]  # five sliding layers, then a global one


def test_gemma3_layers_form_one_global_and_five_sliding_groups_of_three() -> None:
    groups = kv_cache_groups(GEMMA3_270M)
    assert [g.window for g in groups] == [512] * 5 + [None]
    assert groups[-1] == KVCacheGroup((5, 11, 17), None)
    assert groups[0] == KVCacheGroup((0, 1, 2), 512)
    assert sorted(i for g in groups for i in g.layers) == list(range(18))


def test_global_attention_only_is_one_group_of_every_layer() -> None:
    assert kv_cache_groups([None] * 30) == (KVCacheGroup(tuple(range(30)), None),)
    assert kv_cache_groups([64] * 4) == (KVCacheGroup((0, 1, 2, 3), 64),)


def test_group_size_is_the_gcd_of_the_kinds() -> None:
    windows = [None if i % 7 == 6 else 32 for i in range(28)]  # 4 global, 24 sliding
    groups = kv_cache_groups(windows)
    assert {len(g.layers) for g in groups} == {4} and len(groups) == 7
    with pytest.raises(ValueError, match="window"):
        kv_cache_groups([None, 0])


def test_layer_slots_per_pipeline_stage() -> None:
    groups = kv_cache_groups(GEMMA3_270M)
    whole = layer_slots(groups, 0, 18)
    assert whole.num_slots == 3
    assert whole.group_of[:6] == (0, 0, 0, 1, 1, 5) and whole.slot_of[:6] == (0, 1, 2, 0, 1, 0)
    # Stage 2 of 2 (layers 9-17): group 3 has layers 9, 10, 12 there, the global group 11 and 17.
    second = layer_slots(groups, 9, 18)
    assert second.num_slots == 3
    assert dict(zip(range(9, 18), second.slot_of, strict=True))[17] == 1


def _hashes(n: int) -> list[BlockHash]:
    return [b"block-%d" % i for i in range(n)]


def test_sliding_group_drops_blocks_out_of_the_window_and_keeps_its_quota() -> None:
    # block 4, window 8, at most 8 tokens a step: a sliding table holds at most ceil(15 / 4) + 1 = 5 blocks
    bm = BlockManager(64, 4, 0.0, group_windows=(8, None), max_step_tokens=8)
    assert bm.blocks_charged(40) == 5 + 10
    bm.allocate("a", 40)
    assert len(bm.block_table("a", 1)) == 10 and bm.block_table("a", 0) == []
    assert bm.num_available_blocks == 64 - 15
    for start in range(0, 40, 8):
        bm.materialize("a", start, start + 8)
        table = bm.block_table("a", 0)
        live = max(0, start - 7) // 4
        assert table[:live] == [NULL_BLOCK] * live and NULL_BLOCK not in table[live:]
        assert len(table) - live <= 5
        assert bm.num_available_blocks == 64 - 15  # dropping and taking within the quota
    # Decoding on: each new block of the global group costs one, the sliding group's quota is capped.
    assert bm.try_append_slots("a", 41) and bm.num_available_blocks == 64 - 16
    bm.materialize("a", 40, 41)
    assert bm.num_held_blocks("a") == 11 + 3  # blocks 8..10 reach tokens 33..40
    bm.free("a")
    assert bm.num_free_blocks == bm.num_available_blocks == 64


def test_a_long_sequence_is_admitted_where_keeping_everything_would_not_fit() -> None:
    windows = (16, 16, 16, 16, 16, None)
    bm = BlockManager(200, 4, 0.0, group_windows=windows, max_step_tokens=4)
    assert bm.fits_in_empty_cache(400)  # 100 global blocks + 5 x 6 sliding
    assert not BlockManager(200, 4, 0.0, group_windows=(None,) * 6).fits_in_empty_cache(400)
    assert bm.max_tokens_in_empty_cache(10_000) == 4 * (200 - 5 * 6)


@pytest.mark.parametrize("num_blocks", [12, 16])
def test_materialize_outside_the_reservation_is_refused_and_a_long_step_is_charged(num_blocks: int) -> None:
    # Steps of at most 4 tokens: a sliding table holds at most ceil(11 / 4) + 1 = 4 blocks.
    bm = BlockManager(num_blocks, 4, 0.0, group_windows=(8, None), max_step_tokens=4)
    bm.allocate("a", 32)  # 8 global blocks and a quota of 4
    assert bm.num_available_blocks == num_blocks - 12
    with pytest.raises(BlockManagerError, match="reservation"):
        bm.materialize("a", 28, 36)
    bm.materialize("a", 0, 8)
    if num_blocks == 12:  # a 24-token step needs 8 sliding blocks at once: 4 beyond the quota, none left
        with pytest.raises(BlockManagerError, match="beyond the sliding-window quota"):
            bm.materialize("a", 8, 32)
    else:
        bm.materialize("a", 8, 32)
        assert bm.num_available_blocks == 0 and bm.num_free_blocks == 0
    bm.free("a")
    assert bm.num_available_blocks == bm.num_free_blocks == num_blocks


def _compute(bm: BlockManager, seq_id: str, hashes: list[BlockHash], end: int, step: int) -> None:
    """Schedule and 'compute' tokens [0, end) of a sequence in steps, registering full blocks."""
    for start in range(0, end, step):
        bm.materialize(seq_id, start, min(end, start + step))
        bm.cache_full_blocks(seq_id, hashes, min(end, start + step))


def test_dropped_sliding_blocks_stay_cached_until_evicted() -> None:
    bm = BlockManager(64, 4, 0.0, enable_caching=True, group_windows=(8, None), max_step_tokens=8)
    hashes = _hashes(6)
    bm.allocate("a", 24, hashes)
    _compute(bm, "a", hashes, 24, 8)
    table = bm.block_table("a", 0)
    assert table[:2] == [NULL_BLOCK] * 2 and NULL_BLOCK not in table[2:]  # token 16 sees 9 on
    bm.free("a")
    assert bm.prefix_hit(hashes) == 6
    assert bm.allocate("b", 25, hashes) == 6
    # The new sequence shares all six global blocks, and of the sliding group only the blocks that the
    # window of token 24 reads (tokens 17..23: blocks 4 and 5).
    assert bm.block_table("b", 0)[:4] == [NULL_BLOCK] * 4
    assert all(bm.ref_count(b) == 1 for b in bm.block_table("b", 1))
    assert bm.block_table("b", 0)[4:] == [bm.cached_prefix(hashes, 0)[i] for i in (4, 5)]


def _running_with_a_cold_cache() -> tuple[BlockManager, list[BlockHash]]:
    """Sequence "a" (8 blocks of 2 tokens, sliding window 4) computed and still running: it holds every global
    block and sliding blocks 5..7 (the window of token 14, its last step's first); sliding blocks 0..4 were
    freed with their content, and a cold cache forgot them."""
    bm = BlockManager(64, 2, 0.0, enable_caching=True, group_windows=(4, None), max_step_tokens=2)
    hashes = _hashes(8)
    bm.allocate("a", 16, hashes)
    _compute(bm, "a", hashes, 16, 2)
    bm.reset_prefix_cache()
    return bm, hashes


def test_prefix_hit_is_where_every_sliding_window_is_complete() -> None:
    bm, hashes = _running_with_a_cold_cache()
    assert bm.prefix_hit(hashes) == 8  # token 16's window (13..15): blocks 6 and 7
    assert bm.prefix_hit(hashes[:7]) == 7  # token 14's window (11..13): blocks 5 and 6
    # Six blocks would need sliding block 4 (token 12 sees 9..11), shorter prefixes earlier ones: none left.
    assert bm.prefix_hit(hashes[:6]) == 0
    assert bm.cached_prefix(hashes[:6], 1) == bm.block_table("a", 1)[:6]
    # Admitted on that hit, a sequence shares the window's blocks although the ones before were evicted.
    window_blocks = bm.block_table("a", 0)[6:8]
    assert bm.allocate("b", 17, hashes) == 8
    assert bm.block_table("b", 0) == [NULL_BLOCK] * 6 + window_blocks
    assert bm.block_table("b", 1)[:8] == bm.block_table("a", 1)


def test_a_reservation_shorter_than_the_hashes_looks_for_its_hit_within_itself() -> None:
    # Found by the pipelined property test: a hit of 8 blocks cut back to a 3-block reservation needed sliding
    # block 2 (token 6's window), evicted long before, and admission raised a KeyError.
    bm, hashes = _running_with_a_cold_cache()
    assert bm.prefix_hit(hashes) == 8
    assert bm.prefix_hit(hashes[:3]) == 0
    assert bm.can_allocate(6, hashes)
    assert bm.allocate("b", 6, hashes) == 0
    assert bm.block_table("b", 1) != bm.block_table("a", 1)[:3]


def test_scheduler_keeps_a_long_sequence_within_its_windows() -> None:
    """Driven by the sarathi scheduler: sliding tables never hold more than their quota, the pool gets
    everything back, and the sequence fits a pool that could not hold every layer's blocks."""
    sched = build(
        "sarathi",
        num_blocks=80,
        block_size=4,
        max_model_len=256,
        token_budget=8,
        group_windows=(16, 16, None),
    )
    bm = sched.block_manager
    assert not BlockManager(80, 4, 0.0).fits_in_empty_cache(3 * 204)  # three groups keeping everything
    sched.add_sequence(make_seq("long", prompt_len=200, max_tokens=4, max_model_len=256))
    most = 0
    while sched.has_unfinished():
        step(sched)
        if bm.has_blocks("long"):
            sliding = [len(t) - t.count(NULL_BLOCK) for t in bm.block_tables_view("long")[:2]]
            assert max(sliding) <= -(-(16 - 1 + 8) // 4) + 1
            most = max(most, bm.num_held_blocks("long"))
    assert most <= 51 + 2 * 7
    assert bm.num_free_blocks == bm.num_available_blocks == 80
