"""Preallocated paged KV cache: one (k, v) pair of block pools per layer."""

from __future__ import annotations

import torch

from sarathi.model.config import ModelArchConfig


def kv_cache_shape(arch: ModelArchConfig, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
    """Shape of one layer's k (or v) pool: [num_kv_heads, num_blocks, block_size, head_dim]."""
    return (arch.num_key_value_heads, num_blocks, block_size, arch.head_dim)


def kv_cache_bytes_per_block(arch: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers, k and v together (to size the pool from a memory budget)."""
    element_size = torch.empty((), dtype=dtype).element_size()
    per_layer = 2 * arch.num_key_value_heads * block_size * arch.head_dim * element_size
    return per_layer * arch.num_hidden_layers


def allocate_kv_cache(
    arch: ModelArchConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zero-filled (k, v) pools per layer.

    Zeros matter: padded decode rows read unused slots and mask them out with -inf, and 0 * NaN would
    still poison the output if an unused slot held NaN.
    """
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
    shape = kv_cache_shape(arch, num_blocks, block_size)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(arch.num_hidden_layers)
    ]
