"""Attention metadata: turns a batch description (pure Python) into the index tensors attention needs.

A batch is a flat sequence of tokens with no padding. Each entry of the batch (a `SeqSlice`) is either a
decode-like step (one token) or a prefill chunk (several tokens). All one-token entries are attended together
as one padded group; each multi-token chunk is attended on its own with a causal mask aligned to the end of
its keys.

Sliding-window layers use `AttentionMetadata.windowed(W)`: the same batch where each query sees only the W
latest keys (itself included), and prefill chunks read only the blocks their window reaches.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch


@dataclass(frozen=True)
class SeqSlice:
    """One batch entry: `num_tokens` new tokens of a sequence starting at position `start`."""

    block_table: list[int]  # the sequence's KV blocks, covering at least start + num_tokens positions
    start: int  # position of the first new token == tokens already in the KV cache
    num_tokens: int  # 1 for a decode


@dataclass(frozen=True)
class PrefillAttention:
    """A multi-token chunk: batch rows [token_start, token_end) attend to `context_len` cached keys."""

    token_start: int
    token_end: int
    context_len: int  # keys after writing the chunk: start + num_tokens
    # blocks holding keys [first_key, context_len): LongTensor[ceil((context_len - first_key) / block_size)]
    block_table: torch.Tensor
    # bool[num_tokens, context_len - first_key], True where visible (query i sees keys <= start + i, and
    # within a window the W latest). None for plain causal attention over the chunk's own keys.
    mask: torch.Tensor | None
    first_key: int = 0  # position of the first key read (a block boundary; > 0 only under a window)
    window: int = 0  # > 0: each query sees only its `window` latest keys (the mask says so too)

    @property
    def num_tokens(self) -> int:
        """Query rows of this chunk."""
        return self.token_end - self.token_start

    @property
    def reads_cache(self) -> bool:
        """Whether earlier keys exist: the chunk reads its keys from the cache, not only its own new ones."""
        return self.context_len > self.num_tokens

    def windowed(self, window: int, block_size: int) -> PrefillAttention:
        """This chunk where query i sees only keys (start + i - window, start + i]."""
        start = self.context_len - self.num_tokens
        first_block = max(0, start - window + 1) // block_size
        first_key = first_block * block_size
        if not self.reads_cache and self.num_tokens <= window:
            return self  # causal over its own keys already fits the window
        device = self.block_table.device
        queries = torch.arange(start, self.context_len, device=device)[:, None]
        keys = torch.arange(first_key, self.context_len, device=device)[None, :]
        mask = (keys <= queries) & (keys > queries - window)
        return replace(
            self, block_table=self.block_table[first_block:], mask=mask, first_key=first_key, window=window
        )


@dataclass(frozen=True)
class DecodeAttention:
    """All one-token entries of the batch, attended together over block tables padded to the longest."""

    token_indices: torch.Tensor  # LongTensor[B]: their rows in the flattened batch
    block_tables: torch.Tensor  # LongTensor[B, max_blocks], padded with block 0 (masked out)
    context_lens: torch.Tensor  # LongTensor[B]: keys per row (start + 1)
    attn_bias: torch.Tensor  # float32[B, 1, max_blocks * block_size]: 0 where visible, -inf elsewhere
    window: int = 0  # > 0: each row sees only its `window` latest keys

    @property
    def num_seqs(self) -> int:
        """Rows in the group."""
        return self.token_indices.numel()


@dataclass(frozen=True)
class AttentionMetadata:
    """Everything attention needs for one batch, shared by all layers."""

    block_size: int
    positions: torch.Tensor  # LongTensor[T]: position of each new token
    slot_mapping: torch.Tensor  # LongTensor[T]: KV-cache slot of each new token
    prefills: tuple[PrefillAttention, ...]
    decode: DecodeAttention | None

    @property
    def num_tokens(self) -> int:
        """Tokens in the flattened batch."""
        return self.positions.numel()

    def windowed(self, window: int) -> AttentionMetadata:
        """The same batch for a sliding-window layer: every query sees only its `window` latest keys."""
        prefills = tuple(p.windowed(window, self.block_size) for p in self.prefills)
        decode = self.decode
        if decode is not None:
            key_pos = torch.arange(decode.attn_bias.shape[-1], device=decode.attn_bias.device)[None, :]
            too_old = key_pos < (decode.context_lens - window)[:, None]
            bias = decode.attn_bias.masked_fill(too_old[:, None, :], float("-inf"))
            decode = replace(decode, attn_bias=bias, window=window)
        return replace(self, prefills=prefills, decode=decode)


def build_attention_metadata(
    slices: list[SeqSlice], block_size: int, device: torch.device | str = "cpu"
) -> AttentionMetadata:
    """Build the tensors for a batch whose tokens are the concatenation of `slices`, in order."""
    if not slices:
        raise ValueError("a batch needs at least one sequence slice")
    for s in slices:
        _check_slice(s, block_size)
    lens = np.array([s.num_tokens for s in slices], dtype=np.int64)
    starts = np.array([s.start for s in slices], dtype=np.int64)
    blocks_needed = (starts + lens + block_size - 1) // block_size
    # All slices' needed block ids in one flat array; slice i's blocks begin at block_base[i].
    flat_blocks = np.fromiter(
        itertools.chain.from_iterable(
            s.block_table[:n] for s, n in zip(slices, blocks_needed.tolist(), strict=True)
        ),
        dtype=np.int64,
        count=int(blocks_needed.sum()),
    )
    block_base = np.cumsum(blocks_needed) - blocks_needed
    token_base = np.cumsum(lens) - lens

    seq_of_token = np.repeat(np.arange(len(slices)), lens)
    positions = starts[seq_of_token] + np.arange(int(lens.sum())) - token_base[seq_of_token]
    block_of_token = flat_blocks[block_base[seq_of_token] + positions // block_size]
    slot_mapping = block_of_token * block_size + positions % block_size

    is_decode = lens == 1
    prefills = tuple(
        _prefill(
            int(token_base[i]),
            int(starts[i]),
            int(lens[i]),
            flat_blocks,
            int(block_base[i]),
            int(blocks_needed[i]),
            device,
        )
        for i in np.flatnonzero(~is_decode)
    )
    decode = None
    if is_decode.any():
        rows = np.flatnonzero(is_decode)
        decode = _decode_group(
            token_base[rows],
            starts[rows] + 1,
            flat_blocks,
            block_base[rows],
            blocks_needed[rows],
            block_size,
            device,
        )
    return AttentionMetadata(
        block_size=block_size,
        positions=_tensor(positions, device),
        slot_mapping=_tensor(slot_mapping, device),
        prefills=prefills,
        decode=decode,
    )


def _check_slice(s: SeqSlice, block_size: int) -> None:
    if s.num_tokens < 1 or s.start < 0:
        raise ValueError(f"invalid slice: start={s.start}, num_tokens={s.num_tokens}")
    if len(s.block_table) * block_size < s.start + s.num_tokens:
        raise ValueError(
            f"block table of {len(s.block_table)} blocks cannot hold {s.start + s.num_tokens} tokens "
            f"(block_size={block_size})"
        )


def _prefill(
    token_start: int, start: int, num_tokens: int, flat_blocks: np.ndarray, base: int, nblocks: int, device
) -> PrefillAttention:
    context_len = start + num_tokens
    mask = None
    if start > 0:
        mask = torch.arange(context_len)[None, :] <= torch.arange(start, context_len)[:, None]
        mask = mask.to(device)
    return PrefillAttention(
        token_start=token_start,
        token_end=token_start + num_tokens,
        context_len=context_len,
        block_table=_tensor(flat_blocks[base : base + nblocks], device),
        mask=mask,
    )


def _decode_group(
    rows: np.ndarray,
    context_lens: np.ndarray,
    flat_blocks: np.ndarray,
    block_base: np.ndarray,
    blocks_needed: np.ndarray,
    block_size: int,
    device,
) -> DecodeAttention:
    width = int(blocks_needed.max())
    col = np.arange(width)[None, :]
    valid = col < blocks_needed[:, None]
    gather = np.where(valid, block_base[:, None] + col, 0)
    tables = np.where(valid, flat_blocks[gather], 0)
    key_pos = np.arange(width * block_size)[None, :]
    bias = np.where(key_pos < context_lens[:, None], 0.0, -np.inf).astype(np.float32)
    return DecodeAttention(
        token_indices=_tensor(rows, device),
        block_tables=_tensor(tables, device),
        context_lens=_tensor(context_lens, device),
        attn_bias=_tensor(bias[:, None, :], device),
    )


def _tensor(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)
