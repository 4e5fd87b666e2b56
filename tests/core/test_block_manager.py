"""Block manager: unit tests for sizes, the watermark and misuse, plus a stateful property test."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sarathi.core.block_manager import BlockManager, BlockManagerError


def test_blocks_needed_rounds_up() -> None:
    bm = BlockManager(8, 4, watermark=0.0)
    assert [bm.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="num_tokens"):
        bm.blocks_needed(-1)


def test_allocate_grow_free_and_lifo_reuse() -> None:
    bm = BlockManager(8, 4, watermark=0.0)
    bm.allocate("a", 5)
    assert bm.block_table("a") == [0, 1] and bm.num_slots("a") == 8
    bm.allocate("b", 1)
    assert bm.block_table("b") == [2]
    bm.append_slots("a", 8)  # still fits in two blocks
    assert bm.block_table("a") == [0, 1]
    bm.append_slots("a", 9)
    assert bm.block_table("a") == [0, 1, 3]
    assert (bm.num_used_blocks, bm.num_free_blocks) == (4, 4)
    bm.free("a")
    bm.free("a")  # no-op
    assert not bm.has_blocks("a") and bm.num_free_blocks == 7
    bm.allocate("c", 12)
    assert sorted(bm.block_table("c")) == [0, 1, 3], "recently freed blocks are reused first"


def test_watermark_applies_to_admission_only() -> None:
    bm = BlockManager(100, 4, watermark=0.1)
    assert bm.watermark_blocks == 10
    assert bm.fits_in_empty_cache(90 * 4) and not bm.fits_in_empty_cache(90 * 4 + 1)
    assert bm.can_allocate(90 * 4) and not bm.can_allocate(90 * 4 + 1)
    bm.allocate("a", 90 * 4)
    assert bm.num_free_blocks == 10
    assert not bm.can_allocate(1), "the last 10 blocks are kept from new sequences"
    with pytest.raises(BlockManagerError, match="watermark"):
        bm.allocate("b", 1)
    assert bm.can_append_slots("a", 100 * 4), "a running sequence may grow into the watermark"
    assert not bm.can_append_slots("a", 100 * 4 + 1)
    bm.append_slots("a", 100 * 4)
    assert bm.num_free_blocks == 0


def test_misuse_raises_clear_errors() -> None:
    bm = BlockManager(4, 2, watermark=0.0)
    bm.allocate("a", 3)
    with pytest.raises(BlockManagerError, match="already owns"):
        bm.allocate("a", 1)
    with pytest.raises(BlockManagerError, match="cannot allocate"):
        bm.allocate("b", 5)
    with pytest.raises(BlockManagerError, match="cannot grow"):
        bm.append_slots("a", 9)
    assert bm.block_table("a") == [0, 1], "a failed grow changes nothing"
    with pytest.raises(BlockManagerError, match="owns no blocks"):
        bm.append_slots("zz", 1)
    with pytest.raises(BlockManagerError, match="owns no blocks"):
        bm.block_table("zz")
    for bad in ((0, 4, 0.0), (4, 0, 0.0), (4, 4, 1.0), (4, 4, -0.1)):
        with pytest.raises(ValueError):
            BlockManager(*bad)


SEQ_IDS = ["s0", "s1", "s2", "s3", "s4", "s5"]


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / grow / free / preempt-and-readmit against a model of who holds what."""

    @initialize(
        num_blocks=st.integers(1, 40),
        block_size=st.sampled_from([1, 2, 3, 4, 16]),
        watermark=st.sampled_from([0.0, 0.01, 0.1, 0.3]),
    )
    def setup(self, num_blocks: int, block_size: int, watermark: float) -> None:
        self.bm = BlockManager(num_blocks, block_size, watermark)
        self.tokens: dict[str, int] = {}  # model: seq -> tokens its table must hold

    def _needed(self, n: int) -> int:
        return -(-n // self.bm.block_size)

    @rule(seq_id=st.sampled_from(SEQ_IDS), n=st.integers(0, 80))
    def allocate(self, seq_id: str, n: int) -> None:
        expect_ok = seq_id not in self.tokens and self._needed(n) <= (
            self.bm.num_free_blocks - self.bm.watermark_blocks
        )
        if seq_id not in self.tokens:
            assert self.bm.can_allocate(n) == expect_ok
        if expect_ok:
            self.bm.allocate(seq_id, n)
            self.tokens[seq_id] = n
        else:
            with pytest.raises(BlockManagerError):
                self.bm.allocate(seq_id, n)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), grow=st.integers(0, 40))
    def append(self, data: st.DataObject, grow: int) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        target = self.tokens[seq_id] + grow
        missing = max(0, self._needed(target) - len(self.bm.block_table(seq_id)))
        expect_ok = missing <= self.bm.num_free_blocks
        assert self.bm.can_append_slots(seq_id, target) == expect_ok
        if expect_ok:
            self.bm.append_slots(seq_id, target)
            self.tokens[seq_id] = target
        else:
            with pytest.raises(BlockManagerError):
                self.bm.append_slots(seq_id, target)

    @rule(seq_id=st.sampled_from(SEQ_IDS))
    def free(self, seq_id: str) -> None:
        before = self.bm.num_free_blocks
        owned = len(self.bm.block_table(seq_id)) if seq_id in self.tokens else 0
        self.bm.free(seq_id)
        self.tokens.pop(seq_id, None)
        assert self.bm.num_free_blocks == before + owned

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def preempt_and_readmit(self, data: st.DataObject) -> None:
        """Recompute preemption: drop everything, then readmit with the same length if there is room."""
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        n = self.tokens.pop(seq_id)
        self.bm.free(seq_id)
        assert not self.bm.has_blocks(seq_id)
        if self.bm.can_allocate(n):
            self.bm.allocate(seq_id, n)
            self.tokens[seq_id] = n

    @invariant()
    def blocks_are_owned_once(self) -> None:
        if not hasattr(self, "bm"):
            return
        tables = {s: self.bm.block_table(s) for s in self.bm.seq_ids}
        assert set(tables) == set(self.tokens)
        owned = [b for t in tables.values() for b in t]
        free = self.bm.free_block_ids
        assert len(owned) + len(free) == self.bm.num_blocks
        assert sorted(owned + free) == list(range(self.bm.num_blocks)), "a block is lost or owned twice"
        assert self.bm.num_used_blocks + self.bm.num_free_blocks == self.bm.num_blocks
        assert self.bm.num_used_blocks == len(owned)
        for s, n in self.tokens.items():
            # Tables hold what was asked and never more than the largest request rounded up.
            assert len(tables[s]) == self._needed(n)

    def teardown(self) -> None:
        if hasattr(self, "bm"):
            for seq_id in list(self.tokens):
                self.bm.free(seq_id)
            assert self.bm.num_free_blocks == self.bm.num_blocks and not self.bm.seq_ids


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
