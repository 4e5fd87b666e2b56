"""Prefix caching: the block manager's cache (unit and stateful property tests) and its use by schedulers."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sarathi.config import SCHEDULER_NAMES
from sarathi.core.block_hash import hash_block
from sarathi.core.block_manager import BlockManager, BlockManagerError

from .sim import Request, build, make_seq, run_workload, step


def chain(token_ids: list[int], block_size: int) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids``."""
    hashes: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        hashes.append(
            hash_block(hashes[-1] if hashes else None, token_ids[i * block_size : (i + 1) * block_size])
        )
    return hashes


def computed(bm: BlockManager, seq_id: str, token_ids: list[int], num_tokens: int | None = None) -> None:
    """Pretend the model computed ``seq_id``'s first ``num_tokens`` tokens (all by default)."""
    n = len(token_ids) if num_tokens is None else num_tokens
    bm.cache_full_blocks(seq_id, chain(token_ids, bm.block_size), n)


def test_hash_chains_over_the_prefix() -> None:
    a, b = chain([1, 2, 3, 4], 2), chain([9, 9, 3, 4], 2)
    assert a[1] != b[1], "the same tokens after a different prefix are a different block"
    assert chain([1, 2, 3, 4, 5], 2) == a, "a partial block has no hash"
    assert hash_block(None, [1, 2]) == a[0] and len(a[0]) == 32


def test_freed_blocks_are_found_again() -> None:
    bm = BlockManager(8, 4, watermark=0.0, enable_caching=True)
    tokens = list(range(10))
    assert bm.allocate("a", 10, chain(tokens, 4)) == 0
    computed(bm, "a", tokens, 7)  # the second block is not computed yet
    assert bm.num_cached_blocks == 1
    computed(bm, "a", tokens)
    assert bm.num_cached_blocks == 2, "the partial third block is never cached"
    table = bm.block_table("a")
    bm.free("a")
    assert bm.num_free_blocks == 8 and bm.num_used_blocks == 0
    assert bm.cached_prefix(chain(tokens, 4)) == table[:2]
    assert bm.allocate("b", 12, chain([*tokens, 77, 78], 4)) == 2
    assert bm.block_table("b")[:2] == table[:2]


def test_live_sequences_share_blocks() -> None:
    bm = BlockManager(8, 2, watermark=0.0, enable_caching=True)
    tokens = [5, 6, 7, 8, 9]
    bm.allocate("a", 5, chain(tokens, 2))
    computed(bm, "a", tokens)
    assert bm.allocate("b", 6, chain([5, 6, 7, 8, 1, 2], 2)) == 2
    shared = bm.block_table("a")[:2]
    assert bm.block_table("b")[:2] == shared
    assert [bm.ref_count(x) for x in shared] == [2, 2] and bm.num_used_blocks == 3 + 1
    bm.free("a")
    assert [bm.ref_count(x) for x in shared] == [1, 1] and bm.num_used_blocks == 3
    bm.free("b")
    assert bm.num_used_blocks == 0


def test_uncached_blocks_go_first_then_least_recently_freed() -> None:
    bm = BlockManager(4, 1, watermark=0.0, enable_caching=True)
    for sid, tok in (("a", 1), ("b", 2), ("c", 3)):
        bm.allocate(sid, 1, chain([tok], 1))
        computed(bm, sid, [tok])
    bm.free("b")
    bm.free("a")
    bm.free("c")
    a, b, c = (bm.cached_prefix(chain([t], 1))[0] for t in (1, 2, 3))
    assert bm.free_block_ids == [3, b, a, c]
    bm.allocate("d", 2)  # the one empty block, then the least recently freed cached one
    assert bm.block_table("d") == [3, b]
    assert bm.cached_prefix(chain([2], 1)) == [] and bm.block_hash(b) is None, "evicted"
    assert bm.cached_prefix(chain([1], 1)) == [a]


def test_reused_free_blocks_count_against_admission_but_live_ones_do_not() -> None:
    bm = BlockManager(4, 2, watermark=0.0, enable_caching=True)
    tokens = [1, 2, 3, 4, 5]
    bm.allocate("a", 5, chain(tokens, 2))
    computed(bm, "a", tokens)
    bm.allocate("x", 2)  # 4 of 4 blocks used
    hashes = chain(tokens, 2)
    assert bm.can_allocate(4, hashes), "both blocks are live in 'a': no new memory"
    assert not bm.can_allocate(5, hashes)
    bm.free("x")
    bm.free("a")
    assert bm.can_allocate(8, hashes), "two revived blocks plus two new ones"
    bm.allocate("b", 8, hashes)
    assert bm.num_free_blocks == 0
    with pytest.raises(BlockManagerError):
        bm.allocate("c", 1)


def test_caching_off_changes_nothing() -> None:
    bm = BlockManager(4, 2, watermark=0.0)
    bm.allocate("a", 4, chain([1, 2, 3, 4], 2))
    computed(bm, "a", [1, 2, 3, 4])
    assert bm.num_cached_blocks == 0
    bm.free("a")
    assert bm.allocate("b", 4, chain([1, 2, 3, 4], 2)) == 0


# --- stateful property test ----------------------------------------------------------------------

SEQ_IDS = ["s0", "s1", "s2", "s3"]
BASE = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]  # prompts share prefixes of this


class PrefixCacheMachine(RuleBasedStateMachine):
    """Admit with cache lookups, compute chunks, grow, free and preempt, against a model of block contents.

    ``content[b]`` is the hash of the KV that was last written into block ``b`` in full (None if partial).
    """

    @initialize(
        num_blocks=st.integers(2, 24),
        block_size=st.sampled_from([1, 2, 3, 4]),
        watermark=st.sampled_from([0.0, 0.1]),
    )
    def setup(self, num_blocks: int, block_size: int, watermark: float) -> None:
        self.bm = BlockManager(num_blocks, block_size, watermark, enable_caching=True)
        self.tokens: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.content: dict[int, bytes | None] = {}

    def _hashes(self, seq_id: str) -> list[bytes]:
        return chain(self.tokens[seq_id], self.bm.block_size)

    @rule(
        seq_id=st.sampled_from(SEQ_IDS),
        shared=st.integers(0, len(BASE)),
        suffix=st.lists(st.integers(0, 3), max_size=8),
    )
    def admit(self, seq_id: str, shared: int, suffix: list[int]) -> None:
        tokens = BASE[:shared] + suffix
        if seq_id in self.tokens or not tokens:
            return
        bs = self.bm.block_size
        reusable = chain(tokens, bs)[: (len(tokens) - 1) // bs]  # never the last token's block
        if not self.bm.can_allocate(len(tokens), reusable):
            with pytest.raises(BlockManagerError):
                self.bm.allocate(seq_id, len(tokens), reusable)
            return
        hits = self.bm.allocate(seq_id, len(tokens), reusable)
        table = self.bm.block_table(seq_id)
        assert hits * bs < len(tokens)
        for i in range(hits):
            assert self.content[table[i]] == reusable[i], "a hit serves KV of other tokens"
        self.tokens[seq_id], self.computed[seq_id] = tokens, hits * bs

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 9))
    def compute(self, data: st.DataObject, n: int) -> None:
        """The model writes the next ``n`` tokens' KV, then the full computed blocks are offered."""
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        tokens, start, bs = self.tokens[seq_id], self.computed[seq_id], self.bm.block_size
        end = min(len(tokens), start + n)
        if end == start:
            return
        table, hashes = self.bm.block_table(seq_id), self._hashes(seq_id)
        for i in range(start // bs, (end - 1) // bs + 1):
            block = table[i]
            assert self.bm.ref_count(block) == 1 and self.bm.block_hash(block) is None, (
                "writing a shared block"
            )
            self.content[block] = hashes[i] if end >= (i + 1) * bs else None
        self.computed[seq_id] = end
        self.bm.cache_full_blocks(seq_id, hashes, end)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=st.lists(st.integers(0, 3), min_size=1, max_size=5))
    def decode(self, data: st.DataObject, new: list[int]) -> None:
        """Sampled tokens join a fully computed sequence, if its table can grow."""
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        if self.computed[seq_id] < len(self.tokens[seq_id]):
            return
        target = len(self.tokens[seq_id]) + len(new)
        if self.bm.can_append_slots(seq_id, target):
            self.bm.append_slots(seq_id, target)
            self.tokens[seq_id] = self.tokens[seq_id] + new

    @rule(seq_id=st.sampled_from(SEQ_IDS))
    def free(self, seq_id: str) -> None:
        """Finish, abort or preempt (the model forgets it either way)."""
        self.bm.free(seq_id)
        self.tokens.pop(seq_id, None)
        self.computed.pop(seq_id, None)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        tables = {s: bm.block_table(s) for s in bm.seq_ids}
        assert set(tables) == set(self.tokens)
        owned = [b for t in tables.values() for b in t]
        free = bm.free_block_ids
        for b in range(bm.num_blocks):
            assert bm.ref_count(b) == owned.count(b) >= 0, "reference count off"
        assert not set(owned) & set(free), "a block is both free and owned"
        assert len(free) == len(set(free)) and sorted(set(owned) | set(free)) == list(range(bm.num_blocks))
        cached = [b for b in range(bm.num_blocks) if bm.block_hash(b) is not None]
        assert len(cached) == bm.num_cached_blocks
        for b in cached:
            assert self.content.get(b) == bm.block_hash(b), "a cached block's hash does not match its content"
            assert bm.cached_prefix([bm.block_hash(b)]) == [b]

    def teardown(self) -> None:
        if hasattr(self, "bm"):
            for seq_id in list(self.tokens):
                self.bm.free(seq_id)
            bm = self.bm
            assert bm.num_free_blocks == bm.num_blocks and not bm.seq_ids
            assert all(bm.ref_count(b) == 0 for b in range(bm.num_blocks)), "every block free or cached"


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# --- the schedulers ------------------------------------------------------------------------------


def test_admission_starts_after_the_cached_prefix_and_computes_the_last_token() -> None:
    sched = build("sarathi", block_size=4, token_budget=64, enable_caching=True)
    sched.add_sequence(make_seq("a", 10, 1))
    step(sched)  # the prompt runs and its one output finishes it; 2 full blocks stay cached
    sched.add_sequence(make_seq("b", 12, 2))  # the same first 10 tokens, then 2 more
    batch, _ = step(sched)
    (entry,) = batch.entries
    assert (entry.start, entry.num_tokens) == (8, 4)
    assert (batch.prefix_cache_queries, batch.prefix_cache_hits) == (12, 8)
    sched.add_sequence(make_seq("c", 8, 1))  # two full cached blocks, but the last token must be computed
    batch, _ = step(sched)
    assert [(e.seq.seq_id, e.start, e.num_tokens) for e in batch if e.is_prefill] == [("c", 4, 4)]


def test_chunks_start_after_a_hit() -> None:
    sched = build("sarathi", block_size=4, token_budget=6, enable_caching=True)
    sched.add_sequence(make_seq("a", 9, 1))
    while sched.has_unfinished():
        step(sched)
    sched.add_sequence(make_seq("b", 20, 1))
    chunks = []
    while sched.has_unfinished():
        batch, _ = step(sched)
        chunks += [(e.start, e.num_tokens) for e in batch]
    assert chunks == [(8, 6), (14, 6)]


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_shared_prefixes_hit_under_every_scheduler(name: str) -> None:
    """make_seq prompts share their leading tokens, so later arrivals reuse earlier prompts' blocks;
    a tight cache also preempts, and readmissions find their own blocks."""
    sched = build(name, num_blocks=12, block_size=2, max_model_len=24, token_budget=8, enable_caching=True)
    requests = [Request(prompt_len=6 + i % 3, max_tokens=8, arrival_step=i) for i in range(8)]
    result = run_workload(sched, requests, [])
    hits = sum(b.prefix_cache_hits for b in result.batches)
    assert hits > 0 and sum(b.prefix_cache_queries for b in result.batches) > hits
    if name in ("sarathi", "vllm"):
        assert result.num_preemptions > 0


def test_reset_forgets_free_cached_blocks_only() -> None:
    bm = BlockManager(4, 1, watermark=0.0, enable_caching=True)
    for sid, tok in (("a", 1), ("b", 2)):
        bm.allocate(sid, 1, chain([tok], 1))
        computed(bm, sid, [tok])
    bm.free("a")
    bm.reset_prefix_cache()
    assert bm.cached_prefix(chain([1], 1)) == [] and bm.num_cached_blocks == 1
    assert bm.cached_prefix(chain([2], 1)) == bm.block_table("b"), "a held block stays cached"
    assert bm.num_free_blocks == 3
