"""Chained content hashes of full KV blocks: the keys of the prefix cache.

A block's KV depends on every token before it, so a block is named by its own token ids *and* the hash
of the block before it. Pure Python.
"""

from __future__ import annotations

import hashlib
from array import array

from sarathi.core.sequence import Sequence

BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: list[int]) -> BlockHash:
    """The hash of a full block holding ``token_ids`` after the block hashed ``parent`` (None: first).

    SHA-256 rather than Python's ``hash``: a collision would silently serve one request another's KV,
    and prompts come from clients, so 64-bit non-cryptographic hashes are not safe; it costs ~1 us per
    block, nothing next to computing the block.
    """
    h = hashlib.sha256(parent or b"")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def update_block_hashes(seq: Sequence, block_size: int) -> list[BlockHash]:
    """Extend ``seq.block_hashes`` to every full block of its tokens (prompt and outputs); return it.

    Tokens are only ever appended (preemption keeps the outputs), so earlier hashes stay valid.
    """
    hashes = seq.block_hashes
    for i in range(len(hashes), seq.num_tokens // block_size):
        hashes.append(hash_block(hashes[-1] if hashes else None, seq.token_slice(i * block_size, block_size)))
    return hashes
