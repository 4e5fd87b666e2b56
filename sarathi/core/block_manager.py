"""Paged KV cache bookkeeping: a pool of fixed-size blocks, block tables per sequence, and a prefix cache.

Pure Python: it only hands out block ids; the model runner owns the tensors they index.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from sarathi.core.block_hash import BlockHash

#: A block-table entry a sliding-window group no longer holds: its keys fell out of every window.
NULL_BLOCK = -1


class BlockManagerError(RuntimeError):
    """Misuse of the block manager: allocating twice, growing without room, unknown sequence."""


@dataclass
class _SeqBlocks:
    """One sequence's hold on the pool."""

    tables: list[list[int]]  # per group
    reserved: int  # tokens it has room for
    registered: int  # leading blocks already offered to the prefix cache
    quota: dict[int, int]  # per sliding group: blocks its table may hold at once
    dropped: dict[int, int]  # per sliding group: leading NULL_BLOCK entries of its table


class BlockManager:
    """Hands out KV cache blocks to sequences and takes them back.

    A sequence reserves room for a number of tokens; reservations only grow until the sequence is freed.
    ``watermark_blocks`` blocks are kept free when admitting a new sequence (but not when growing a
    running one), so that admissions do not immediately force running sequences to be preempted.

    The model's layers form KV-cache groups (``group_windows``: one entry per group, None for global
    attention, else the sliding window; see ``sarathi.core.kv_groups``); each sequence has one block table
    per group, all drawing from the one pool. A global group's table holds every block of the reservation
    from the start. A sliding group's table is filled as tokens are scheduled (``materialize``) and drops
    the blocks before the window of the first token being computed (they become ``NULL_BLOCK``), so it
    holds at most ``blocks_needed(window - 1 + max_step_tokens) + 1`` blocks, where ``max_step_tokens`` is
    the most tokens of one sequence in one step. Admission charges a sliding group that bound (its
    quota), not the sequence's length, and keeps it promised: the free pool always covers every
    sequence's unfilled quota, so ``materialize`` never runs out within it (a longer step is charged its
    extra blocks then, or refused).

    With ``enable_caching``, a full block whose KV has been computed is registered under its chained
    content hash (``cache_full_blocks``), per group; a new sequence whose leading block hashes are
    registered shares those blocks (reference counts) instead of recomputing them, as far as every group
    has what the next token needs (``prefix_hit``: a global group every block, a sliding group the blocks
    of the window). A freed registered block stays free but reusable until its memory is needed: free
    blocks without content are handed out first (last in, first out, as without caching), then
    registered ones least recently freed first.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        watermark: float = 0.01,
        enable_caching: bool = False,
        group_windows: Sequence[int | None] = (None,),
        max_step_tokens: int | None = None,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        if not group_windows or any(w is not None and w < 1 for w in group_windows):
            raise ValueError(f"group_windows needs one entry per group, None or >= 1, got {group_windows}")
        if max_step_tokens is not None and max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {max_step_tokens}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_blocks)
        self.enable_caching = enable_caching
        self.group_windows = tuple(group_windows)
        self.max_step_tokens = max_step_tokens
        self._global_groups = [g for g, w in enumerate(self.group_windows) if w is None]
        self._sliding_groups = [g for g, w in enumerate(self.group_windows) if w is not None]
        # Most blocks a sliding group's table holds at once (None: unbounded, no max_step_tokens).
        self._quota_cap = {
            g: None if max_step_tokens is None else self.blocks_needed(w - 1 + max_step_tokens) + 1
            for g, w in enumerate(self.group_windows)
            if w is not None
        }
        # A stack of free blocks with no cached content: pop() takes from the end, so block 0 goes out
        # first and freed blocks come back first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Free blocks with cached content, least recently freed first: O(1) append, evict and revive.
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._ref_count = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._group: list[int] = [0] * num_blocks  # the group a block was last taken for
        self._cached: list[dict[BlockHash, int]] = [{} for _ in self.group_windows]
        self._seqs: dict[str, _SeqBlocks] = {}
        # Sliding groups' promise: the sum of their quotas minus the blocks they hold (each counted once).
        self._sliding_quota = 0
        self._sliding_held = 0
        self.num_evictions = 0  # cached blocks whose content was dropped to make room

    # --- sizes -------------------------------------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached content or not."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_available_blocks(self) -> int:
        """Free blocks not promised to running sequences' sliding-window groups."""
        return self.num_free_blocks - (self._sliding_quota - self._sliding_held)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (held by sequences or free)."""
        return sum(len(c) for c in self._cached)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.block_size)

    def blocks_charged(self, num_tokens: int) -> int:
        """Blocks a reservation of ``num_tokens`` tokens charges the pool, over all groups."""
        n = self.blocks_needed(num_tokens)
        return n * len(self._global_groups) + sum(self._quota(g, n) for g in self._sliding_groups)

    def fits_in_empty_cache(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens could be admitted into an otherwise empty cache."""
        return self.blocks_charged(num_tokens) <= self.num_blocks - self.watermark_blocks

    def max_tokens_in_empty_cache(self, limit: int) -> int:
        """The longest sequence (at most ``limit`` tokens) an otherwise empty cache admits."""
        if self.fits_in_empty_cache(limit):
            return limit
        lo, hi = 0, limit  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.fits_in_empty_cache(mid) else (lo, mid)
        return lo

    # --- the prefix cache --------------------------------------------------------------------------------
    def cached_prefix(self, block_hashes: Sequence[BlockHash], group: int = 0) -> list[int]:
        """Block ids of group ``group``'s longest leading run of ``block_hashes`` found in the cache (none if
        disabled)."""
        blocks: list[int] = []
        if self.enable_caching:
            cached = self._cached[group]
            for h in block_hashes:
                block = cached.get(h)
                if block is None:
                    break
                blocks.append(block)
        return blocks

    def prefix_hit(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``block_hashes`` a new sequence can take from the cache: every global
        group has all of them, every sliding group the blocks the next token's window reaches."""
        if not self.enable_caching or not block_hashes:
            return 0
        hit = len(block_hashes)
        for g in self._global_groups:
            hit = min(hit, len(self.cached_prefix(block_hashes[:hit], g)))
        # A sliding group that shortens the hit moves every window back: check them all again at the
        # shorter hit, until all agree (the hit only shrinks, so this ends).
        while True:
            before = hit
            for g in self._sliding_groups:
                hit = self._sliding_hit(g, block_hashes, hit)
            if hit == before:
                return hit

    def _sliding_hit(self, group: int, block_hashes: Sequence[BlockHash], most: int) -> int:
        """The largest k <= ``most`` whose window blocks (those of keys k * bs - window + 1 .. k * bs - 1)
        are all cached in sliding group ``group``."""
        cached = self._cached[group]
        k = most
        while k > 0:  # scan back from the longest candidate: usually only its window is looked at
            live = self._first_live_block(group, k * self.block_size)
            j = k - 1
            while j >= live and block_hashes[j] in cached:
                j -= 1
            if j < live:
                return k
            k = j  # block j is missing: a usable prefix ends at or before it
        return 0

    def _first_live_block(self, group: int, position: int) -> int:
        """The first block a sliding group needs when the token at ``position`` is the next computed."""
        return max(0, position - self.group_windows[group] + 1) // self.block_size

    def cache_full_blocks(self, seq_id: str, block_hashes: Sequence[BlockHash], num_computed: int) -> None:
        """Register ``seq_id``'s full blocks whose KV is computed (its first ``num_computed`` tokens).

        ``block_hashes[i]`` names the content of table block ``i``. A block whose hash is already
        registered elsewhere (two requests computed the same prefix at once) stays unregistered.
        """
        if not self.enable_caching:
            return
        state = self._state(seq_id)
        start = state.registered
        end = min(num_computed // self.block_size, len(block_hashes))
        for g, table in enumerate(state.tables):
            cached = self._cached[g]
            for i in range(start, min(end, len(table))):
                block, h = table[i], block_hashes[i]
                if block != NULL_BLOCK and self._hash[block] is None and h not in cached:
                    self._hash[block] = h
                    cached[h] = block
        state.registered = max(start, end)

    def reset_prefix_cache(self) -> None:
        """Forget the content of every free cached block (a cold cache, e.g. after a warm-up run)."""
        while self._evictable:
            self._free.append(self._evict())

    # --- new sequences -----------------------------------------------------------------------------------
    def can_allocate(self, num_tokens: int, block_hashes: Sequence[BlockHash] = ()) -> bool:
        """Whether a new sequence needing room for ``num_tokens`` tokens can be admitted now.

        Cached blocks it would share (the leading run of ``block_hashes``) are not new memory; those
        that are free still leave the free pool.
        """
        block_hashes = block_hashes[: self.blocks_needed(num_tokens)]
        cost = self._allocation_cost(num_tokens, self.prefix_hit(block_hashes), block_hashes)
        return cost <= self.num_available_blocks - self.watermark_blocks

    def allocate(self, seq_id: str, num_tokens: int, block_hashes: Sequence[BlockHash] = ()) -> int:
        """Give a new sequence room for ``num_tokens`` tokens; return how many leading blocks it shares from
        the cache (their KV is already computed)."""
        if seq_id in self._seqs:
            raise BlockManagerError(f"sequence {seq_id!r} already owns blocks; free it before allocating")
        needed = self.blocks_needed(num_tokens)
        # A hit is looked for within the reservation: a sliding group's window is checked at the hit found,
        # so a longer hit cut back to `needed` afterwards could need window blocks that are not cached.
        block_hashes = block_hashes[:needed]
        hit = self.prefix_hit(block_hashes)
        cost = self._allocation_cost(num_tokens, hit, block_hashes)
        if cost > self.num_available_blocks - self.watermark_blocks:
            raise BlockManagerError(
                f"cannot allocate {cost} blocks for {seq_id!r}: {self.num_available_blocks} available, "
                f"{self.watermark_blocks} kept as watermark"
            )
        state = _SeqBlocks([], num_tokens, hit, {}, {})
        for g, window in enumerate(self.group_windows):
            if window is None:
                table = self.cached_prefix(block_hashes[:hit], g)
            else:
                live = self._first_live_block(g, hit * self.block_size)
                # the window's blocks only: the ones before it may have been evicted
                table = [NULL_BLOCK] * live + [self._cached[g][h] for h in block_hashes[live:hit]]
                state.quota[g], state.dropped[g] = self._quota(g, needed), live
                self._sliding_quota += state.quota[g]
            for block in table:  # before any _take, which could otherwise evict them
                if block != NULL_BLOCK:
                    self._hold(block, window is not None)
            state.tables.append(table)
        for g in self._global_groups:
            state.tables[g] += self._take(needed - hit, g)
        self._seqs[seq_id] = state
        return hit

    # --- running sequences -------------------------------------------------------------------------------
    def can_append_slots(self, seq_id: str, num_tokens: int) -> bool:
        """Whether ``seq_id`` can grow to hold ``num_tokens`` tokens in total (ignores watermark)."""
        return self._growth_cost(seq_id, num_tokens) <= self.num_available_blocks

    def try_append_slots(self, seq_id: str, num_tokens: int) -> bool:
        """``append_slots`` if there is room (True), else nothing (False): one check on the hot path."""
        state = self._state(seq_id)
        if -(-num_tokens // self.block_size) <= -(-state.reserved // self.block_size):  # within its blocks
            state.reserved = max(state.reserved, num_tokens)
            return True
        cost = self._growth_cost(seq_id, num_tokens)
        if cost == 0:
            self._grow(seq_id, num_tokens)
            return True
        if cost > self.num_available_blocks:
            return False
        self._grow(seq_id, num_tokens)
        return True

    def append_slots(self, seq_id: str, num_tokens: int) -> None:
        """Grow ``seq_id`` to hold ``num_tokens`` tokens in total; a no-op if it already does."""
        cost = self._growth_cost(seq_id, num_tokens)
        if cost > self.num_available_blocks:
            raise BlockManagerError(
                f"cannot grow {seq_id!r} to {num_tokens} tokens: needs {cost} more blocks, "
                f"{self.num_available_blocks} available"
            )
        self._grow(seq_id, num_tokens)

    def materialize(self, seq_id: str, start: int, end: int) -> None:
        """Tokens [start, end) of ``seq_id`` are about to be computed: sliding groups drop the blocks before
        the window of token ``start`` and take blocks up to token ``end`` from their quota (a step of more
        than ``max_step_tokens`` may need more: charged now if available, else BlockManagerError).

        A no-op without sliding groups: global groups hold their whole reservation already.
        """
        if not self._sliding_groups:
            return
        state = self._state(seq_id)
        if end > state.reserved or start > end:
            raise BlockManagerError(
                f"{seq_id!r}: tokens [{start}, {end}) are outside its reservation of {state.reserved}"
            )
        needed = self.blocks_needed(end)
        for g in self._sliding_groups:
            table = state.tables[g]
            live = self._first_live_block(g, start)
            for i in range(state.dropped[g], min(live, len(table))):
                self._release(table[i])
                table[i] = NULL_BLOCK
            table += [NULL_BLOCK] * (live - len(table))  # blocks never needed (a profiling batch)
            state.dropped[g] = max(state.dropped[g], live)
            extra = needed - state.dropped[g] - state.quota[g]
            if extra > 0:  # a step longer than max_step_tokens: charge its extra blocks now
                if extra > self.num_available_blocks:
                    raise BlockManagerError(
                        f"{seq_id!r}: tokens [{start}, {end}) need {extra} blocks beyond the sliding-window "
                        f"quota, {self.num_available_blocks} available"
                    )
                state.quota[g] += extra
                self._sliding_quota += extra
            if needed > len(table):
                table += self._take(needed - len(table), g)

    def free(self, seq_id: str) -> None:
        """Drop ``seq_id``'s hold on its blocks; a no-op if it owns none.

        Blocks no other sequence holds become free: cached ones stay reusable until evicted.
        """
        state = self._seqs.pop(seq_id, None)
        if state is None:
            return
        self._sliding_quota -= sum(state.quota.values())
        # Reversed: the table's first uncached block is the next one handed out, and its last cached
        # block (the least likely to be shared: a longer prefix) is evicted before its first.
        for table in state.tables:
            for block in reversed(table):
                if block != NULL_BLOCK:
                    self._release(block)

    # --- inspection --------------------------------------------------------------------------------------
    def block_table(self, seq_id: str, group: int = 0) -> list[int]:
        """A copy of ``seq_id``'s block ids in group ``group``, in token order."""
        return list(self._state(seq_id).tables[group])

    def block_table_view(self, seq_id: str, group: int = 0) -> Sequence[int]:
        """``seq_id``'s block ids in group ``group`` without a copy (read only; valid until the table next
        changes)."""
        return self._state(seq_id).tables[group]

    def block_tables_view(self, seq_id: str) -> Sequence[Sequence[int]]:
        """``seq_id``'s block table of every group, without copies (read only)."""
        return self._state(seq_id).tables

    def num_held_blocks(self, seq_id: str) -> int:
        """Blocks ``seq_id``'s tables hold over all groups (shared ones included)."""
        state = self._state(seq_id)
        return sum(len(t) for t in state.tables) - sum(state.dropped.values())

    def has_blocks(self, seq_id: str) -> bool:
        """Whether ``seq_id`` has a block table (it was allocated and not freed)."""
        return seq_id in self._seqs

    def num_slots(self, seq_id: str) -> int:
        """How many tokens ``seq_id`` has room for (0 for a sequence without a table)."""
        state = self._seqs.get(seq_id)
        return 0 if state is None else self.blocks_needed(state.reserved) * self.block_size

    @property
    def seq_ids(self) -> list[str]:
        """Sequences that own a block table."""
        return list(self._seqs)

    @property
    def free_block_ids(self) -> list[int]:
        """A copy of the free blocks: those without cached content, then cached ones in eviction order."""
        return list(self._free) + list(self._evictable)

    def ref_count(self, block: int) -> int:
        """How many block tables hold ``block``."""
        return self._ref_count[block]

    def block_hash(self, block: int) -> BlockHash | None:
        """The content hash ``block`` is cached under, or None."""
        return self._hash[block]

    # --- internals ---------------------------------------------------------------------------------------
    def _state(self, seq_id: str) -> _SeqBlocks:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise BlockManagerError(f"sequence {seq_id!r} owns no blocks") from None

    def _quota(self, group: int, num_blocks: int) -> int:
        """Blocks a sliding group's table may hold at once for a reservation of ``num_blocks`` blocks."""
        cap = self._quota_cap[group]
        return num_blocks if cap is None else min(num_blocks, cap)

    def _allocation_cost(self, num_tokens: int, hit: int, block_hashes: Sequence[BlockHash]) -> int:
        """Free blocks an allocation takes or promises: global groups' new blocks and revived cached hits,
        sliding groups' quotas (their cached hits are part of the quota)."""
        needed = self.blocks_needed(num_tokens)
        hit = min(hit, needed)
        cost = 0
        for g in self._global_groups:
            hits = self.cached_prefix(block_hashes[:hit], g) if hit else []
            revived = sum(1 for b in hits if self._ref_count[b] == 0)
            cost += needed - hit + revived
        return cost + sum(self._quota(g, needed) for g in self._sliding_groups)

    def _growth_cost(self, seq_id: str, num_tokens: int) -> int:
        state = self._state(seq_id)
        old, new = self.blocks_needed(state.reserved), self.blocks_needed(num_tokens)
        if new <= old:
            return 0
        cost = sum(new - len(state.tables[g]) for g in self._global_groups)
        return cost + sum(max(0, self._quota(g, new) - state.quota[g]) for g in self._sliding_groups)

    def _grow(self, seq_id: str, num_tokens: int) -> None:
        state = self._seqs[seq_id]
        if num_tokens <= state.reserved:
            return
        new = self.blocks_needed(num_tokens)
        for g in self._global_groups:
            state.tables[g] += self._take(new - len(state.tables[g]), g)
        for g in self._sliding_groups:
            more = max(0, self._quota(g, new) - state.quota[g])
            state.quota[g] += more
            self._sliding_quota += more
        state.reserved = num_tokens

    def _hold(self, block: int, sliding: bool) -> None:
        """One more table holds ``block`` (a cached hit)."""
        if self._ref_count[block] == 0:
            del self._evictable[block]
            if sliding:
                self._sliding_held += 1
        self._ref_count[block] += 1

    def _release(self, block: int) -> None:
        """One table fewer holds ``block``: it becomes free (reusable if cached) when none does."""
        self._ref_count[block] -= 1
        if self._ref_count[block] == 0:
            if self.group_windows[self._group[block]] is not None:
                self._sliding_held -= 1
            if self._hash[block] is None:
                self._free.append(block)
            else:
                self._evictable[block] = None

    def _take(self, n: int, group: int) -> list[int]:
        if n <= 0:
            return []
        if n > self.num_free_blocks:
            raise BlockManagerError(f"out of KV blocks: need {n}, {self.num_free_blocks} free")
        from_free = min(n, len(self._free))
        taken = self._free[len(self._free) - from_free :]
        del self._free[len(self._free) - from_free :]
        taken.reverse()
        taken += [self._evict() for _ in range(n - from_free)]
        for block in taken:
            self._ref_count[block] = 1
            self._group[block] = group
        if self.group_windows[group] is not None:
            self._sliding_held += n
        return taken

    def _evict(self) -> int:
        """Take the least recently freed cached block out of the cache."""
        block, _ = self._evictable.popitem(last=False)
        del self._cached[self._group[block]][self._hash[block]]
        self._hash[block] = None
        self.num_evictions += 1
        return block
