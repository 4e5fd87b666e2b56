"""Paged KV cache bookkeeping: a pool of fixed-size blocks, block tables per sequence, and a prefix cache.

Pure Python: it only hands out block ids; the model runner owns the tensors they index.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from sarathi.core.block_hash import BlockHash


class BlockManagerError(RuntimeError):
    """Misuse of the block manager: allocating twice, growing without room, unknown sequence."""


class BlockManager:
    """Hands out KV cache blocks to sequences and takes them back.

    A sequence's block table holds enough blocks for a number of tokens; tables only grow until the
    sequence is freed. ``watermark_blocks`` blocks are kept free when admitting a new sequence (but not
    when growing a running one), so that admissions do not immediately force running sequences to be
    preempted.

    With ``enable_caching``, a full block whose KV has been computed is registered under its chained
    content hash (``cache_full_blocks``); a new sequence whose leading block hashes are registered shares
    those blocks (reference counts) instead of recomputing them. A freed registered block stays free but
    reusable until its memory is needed: free blocks without content are handed out first (last in,
    first out, as without caching), then registered ones least recently freed first.
    """

    def __init__(
        self, num_blocks: int, block_size: int, watermark: float = 0.01, enable_caching: bool = False
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_blocks)
        self.enable_caching = enable_caching
        # A stack of free blocks with no cached content: pop() takes from the end, so block 0 goes out
        # first and freed blocks come back first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Free blocks with cached content, least recently freed first: O(1) append, evict and revive.
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._ref_count = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}
        self._tables: dict[str, list[int]] = {}
        # How many leading blocks of each table were already offered to the cache.
        self._num_registered: dict[str, int] = {}
        self.num_evictions = 0  # cached blocks whose content was dropped to make room

    # --- sizes -------------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached content or not."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (held by sequences or free)."""
        return len(self._cached)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.block_size)

    def fits_in_empty_cache(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens could be admitted into an otherwise empty cache."""
        return self.blocks_needed(num_tokens) <= self.num_blocks - self.watermark_blocks

    # --- the prefix cache --------------------------------------------------------------------------------
    def cached_prefix(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Block ids of the longest leading run of ``block_hashes`` found in the cache (none if disabled)."""
        blocks: list[int] = []
        if self.enable_caching:
            for h in block_hashes:
                block = self._cached.get(h)
                if block is None:
                    break
                blocks.append(block)
        return blocks

    def cache_full_blocks(self, seq_id: str, block_hashes: Sequence[BlockHash], num_computed: int) -> None:
        """Register ``seq_id``'s full blocks whose KV is computed (its first ``num_computed`` tokens).

        ``block_hashes[i]`` names the content of table block ``i``. A block whose hash is already
        registered elsewhere (two requests computed the same prefix at once) stays unregistered.
        """
        if not self.enable_caching:
            return
        table = self._table(seq_id)
        start = self._num_registered.get(seq_id, 0)
        end = min(num_computed // self.block_size, len(block_hashes), len(table))
        for i in range(start, end):
            block, h = table[i], block_hashes[i]
            if self._hash[block] is None and h not in self._cached:
                self._hash[block] = h
                self._cached[h] = block
        self._num_registered[seq_id] = max(start, end)

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
        return self._blocks_to_take(num_tokens, self.cached_prefix(block_hashes)) <= (
            self.num_free_blocks - self.watermark_blocks
        )

    def allocate(self, seq_id: str, num_tokens: int, block_hashes: Sequence[BlockHash] = ()) -> int:
        """Give a new sequence a block table with room for ``num_tokens`` tokens; return how many leading
        blocks it shares from the cache (their KV is already computed)."""
        if seq_id in self._tables:
            raise BlockManagerError(f"sequence {seq_id!r} already owns blocks; free it before allocating")
        hits = self.cached_prefix(block_hashes)
        needed = self._blocks_to_take(num_tokens, hits)
        if needed > self.num_free_blocks - self.watermark_blocks:
            raise BlockManagerError(
                f"cannot allocate {needed} blocks for {seq_id!r}: "
                f"{self.num_free_blocks} free, {self.watermark_blocks} kept as watermark"
            )
        hits = hits[: self.blocks_needed(num_tokens)]
        for block in hits:  # before _take, which could otherwise evict them
            if self._ref_count[block] == 0:
                del self._evictable[block]
            self._ref_count[block] += 1
        self._tables[seq_id] = hits + self._take(self.blocks_needed(num_tokens) - len(hits))
        self._num_registered[seq_id] = len(hits)
        return len(hits)

    # --- running sequences -------------------------------------------------------------------------------
    def can_append_slots(self, seq_id: str, num_tokens: int) -> bool:
        """Whether ``seq_id``'s table can grow to hold ``num_tokens`` tokens in total (ignores watermark)."""
        return self._missing_blocks(seq_id, num_tokens) <= self.num_free_blocks

    def try_append_slots(self, seq_id: str, num_tokens: int) -> bool:
        """``append_slots`` if there is room (True), else nothing (False): one check on the hot path."""
        missing = self._missing_blocks(seq_id, num_tokens)
        if missing == 0:
            return True
        if missing > self.num_free_blocks:
            return False
        self._tables[seq_id].extend(self._take(missing))
        return True

    def append_slots(self, seq_id: str, num_tokens: int) -> None:
        """Grow ``seq_id``'s table to hold ``num_tokens`` tokens in total; a no-op if it already does."""
        missing = self._missing_blocks(seq_id, num_tokens)
        if missing == 0:
            return
        if missing > self.num_free_blocks:
            raise BlockManagerError(
                f"cannot grow {seq_id!r} to {num_tokens} tokens: needs {missing} more blocks, "
                f"{self.num_free_blocks} free"
            )
        self._tables[seq_id].extend(self._take(missing))

    def free(self, seq_id: str) -> None:
        """Drop ``seq_id``'s hold on its blocks; a no-op if it owns none.

        Blocks no other sequence holds become free: cached ones stay reusable until evicted.
        """
        table = self._tables.pop(seq_id, None)
        self._num_registered.pop(seq_id, None)
        # Reversed: the table's first uncached block is the next one handed out, and its last cached
        # block (the least likely to be shared: a longer prefix) is evicted before its first.
        for block in reversed(table or ()):
            self._ref_count[block] -= 1
            if self._ref_count[block] == 0:
                if self._hash[block] is None:
                    self._free.append(block)
                else:
                    self._evictable[block] = None

    # --- inspection --------------------------------------------------------------------------------------
    def block_table(self, seq_id: str) -> list[int]:
        """A copy of ``seq_id``'s block ids, in token order."""
        return list(self._table(seq_id))

    def block_table_view(self, seq_id: str) -> Sequence[int]:
        """``seq_id``'s block ids without a copy (read only; valid until the table next changes)."""
        return self._table(seq_id)

    def has_blocks(self, seq_id: str) -> bool:
        """Whether ``seq_id`` has a block table (it was allocated and not freed)."""
        return seq_id in self._tables

    def num_slots(self, seq_id: str) -> int:
        """How many tokens ``seq_id``'s table can hold (0 for a sequence without a table)."""
        return len(self._tables.get(seq_id, ())) * self.block_size

    @property
    def seq_ids(self) -> list[str]:
        """Sequences that own a block table."""
        return list(self._tables)

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
    def _table(self, seq_id: str) -> list[int]:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise BlockManagerError(f"sequence {seq_id!r} owns no blocks") from None

    def _missing_blocks(self, seq_id: str, num_tokens: int) -> int:
        return max(0, self.blocks_needed(num_tokens) - len(self._table(seq_id)))

    def _blocks_to_take(self, num_tokens: int, hits: list[int]) -> int:
        """Free blocks an allocation takes: new ones, plus cached hits that are currently free."""
        hits = hits[: self.blocks_needed(num_tokens)]
        revived = sum(1 for b in hits if self._ref_count[b] == 0)
        return self.blocks_needed(num_tokens) - len(hits) + revived

    def _take(self, n: int) -> list[int]:
        from_free = min(n, len(self._free))
        taken = self._free[len(self._free) - from_free :]
        del self._free[len(self._free) - from_free :]
        taken.reverse()
        taken += [self._evict() for _ in range(n - from_free)]
        for block in taken:
            self._ref_count[block] = 1
        return taken

    def _evict(self) -> int:
        """Take the least recently freed cached block out of the cache."""
        block, _ = self._evictable.popitem(last=False)
        del self._cached[self._hash[block]]
        self._hash[block] = None
        self.num_evictions += 1
        return block
