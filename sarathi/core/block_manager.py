"""Paged KV cache bookkeeping: a pool of fixed-size blocks, one free list and a block table per sequence.

Pure Python: it only hands out block ids; the model runner owns the tensors they index.
"""

from __future__ import annotations


class BlockManagerError(RuntimeError):
    """Misuse of the block manager: allocating twice, growing without room, unknown sequence."""


class BlockManager:
    """Hands out KV cache blocks to sequences and takes them back.

    A sequence's block table holds enough blocks for a number of tokens; tables only grow until the
    sequence is freed. ``watermark_blocks`` blocks are kept free when admitting a new sequence (but not
    when growing a running one), so that admissions do not immediately force running sequences to be
    preempted. Freed blocks are reused last-in first-out.
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01) -> None:
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
        # A stack: pop() takes from the end, so block 0 goes out first and freed blocks come back first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}

    # --- sizes -------------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.block_size)

    def fits_in_empty_cache(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens could be admitted into an otherwise empty cache."""
        return self.blocks_needed(num_tokens) <= self.num_blocks - self.watermark_blocks

    # --- new sequences -----------------------------------------------------------------------------------
    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence needing room for ``num_tokens`` tokens can be admitted now."""
        return self.blocks_needed(num_tokens) <= self.num_free_blocks - self.watermark_blocks

    def allocate(self, seq_id: str, num_tokens: int) -> None:
        """Give a new sequence a block table with room for ``num_tokens`` tokens."""
        if seq_id in self._tables:
            raise BlockManagerError(f"sequence {seq_id!r} already owns blocks; free it before allocating")
        if not self.can_allocate(num_tokens):
            raise BlockManagerError(
                f"cannot allocate {self.blocks_needed(num_tokens)} blocks for {seq_id!r}: "
                f"{self.num_free_blocks} free, {self.watermark_blocks} kept as watermark"
            )
        self._tables[seq_id] = self._take(self.blocks_needed(num_tokens))

    # --- running sequences -------------------------------------------------------------------------------
    def can_append_slots(self, seq_id: str, num_tokens: int) -> bool:
        """Whether ``seq_id``'s table can grow to hold ``num_tokens`` tokens in total (ignores watermark)."""
        return self._missing_blocks(seq_id, num_tokens) <= self.num_free_blocks

    def append_slots(self, seq_id: str, num_tokens: int) -> None:
        """Grow ``seq_id``'s table to hold ``num_tokens`` tokens in total; a no-op if it already does."""
        missing = self._missing_blocks(seq_id, num_tokens)
        if missing > self.num_free_blocks:
            raise BlockManagerError(
                f"cannot grow {seq_id!r} to {num_tokens} tokens: needs {missing} more blocks, "
                f"{self.num_free_blocks} free"
            )
        self._tables[seq_id].extend(self._take(missing))

    def free(self, seq_id: str) -> None:
        """Return all of ``seq_id``'s blocks to the pool; a no-op if it owns none."""
        table = self._tables.pop(seq_id, None)
        if table:
            # Reversed so that the table's first block is the next one handed out.
            self._free.extend(reversed(table))

    # --- inspection --------------------------------------------------------------------------------------
    def block_table(self, seq_id: str) -> list[int]:
        """A copy of ``seq_id``'s block ids, in token order."""
        return list(self._table(seq_id))

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
        """A copy of the free list."""
        return list(self._free)

    # --- internals ---------------------------------------------------------------------------------------
    def _table(self, seq_id: str) -> list[int]:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise BlockManagerError(f"sequence {seq_id!r} owns no blocks") from None

    def _missing_blocks(self, seq_id: str, num_tokens: int) -> int:
        return max(0, self.blocks_needed(num_tokens) - len(self._table(seq_id)))

    def _take(self, n: int) -> list[int]:
        taken = self._free[len(self._free) - n :]
        del self._free[len(self._free) - n :]
        taken.reverse()
        return taken
