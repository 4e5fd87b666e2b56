"""Preallocated paged KV cache: (k, v) block pools for the layers of this shard.

The engine's layout shares pools between KV-cache groups (``sarathi.core.kv_groups``): a block id is a page
that belongs to one group at a time, and the layers in the same slot of different groups use one pool.
"""

from __future__ import annotations

import torch

from sarathi.config import DEFAULT_KV_CACHE_MEMORY_GIB, EngineConfig
from sarathi.core.kv_groups import layer_slots
from sarathi.model.config import ModelArchConfig
from sarathi.model.parallel import WHOLE_MODEL, ShardSpec, shards_of


def kv_cache_shape(
    arch: ModelArchConfig, num_blocks: int, block_size: int, shard: ShardSpec = WHOLE_MODEL
) -> tuple[int, int, int, int]:
    """Shape of one layer's k (or v) pool: [kv heads of this TP rank, num_blocks, block_size, head_dim]."""
    start, end = shard.kv_head_range(arch.num_key_value_heads)
    return (end - start, num_blocks, block_size, arch.head_dim)


def _num_layers(arch: ModelArchConfig, shard: ShardSpec) -> int:
    start, end = shard.layer_range(arch.num_hidden_layers)
    return end - start


def _num_pools(arch: ModelArchConfig, shard: ShardSpec) -> int:
    """(k, v) pool pairs of the shard's stage in the shared-page layout: its largest group share."""
    return layer_slots(arch.kv_cache_groups, *shard.layer_range(arch.num_hidden_layers)).num_slots


def kv_cache_bytes_per_block(
    arch: ModelArchConfig, block_size: int, dtype: torch.dtype, shard: ShardSpec = WHOLE_MODEL
) -> int:
    """Bytes one block (a page of the shared-page layout) costs across the shard's pools, k and v
    together (to size the pool from a memory budget); for the shard's own kv heads only."""
    element_size = torch.empty((), dtype=dtype).element_size()
    kv_heads, _, _, head_dim = kv_cache_shape(arch, 1, block_size, shard)
    per_layer = 2 * kv_heads * block_size * head_dim * element_size
    return per_layer * _num_pools(arch, shard)


def kv_blocks_for(config: EngineConfig, arch: ModelArchConfig) -> int:
    """Blocks in the pool: ``num_kv_blocks``, or what the memory budget (per worker) holds on the worker
    whose shard needs the most bytes per block."""
    cc = config.cache
    if cc.num_kv_blocks is not None:
        return cc.num_kv_blocks
    gib = DEFAULT_KV_CACHE_MEMORY_GIB if cc.kv_cache_memory_gib is None else cc.kv_cache_memory_gib
    dtype = getattr(torch, config.model.storage_dtype)
    per_block = max(
        kv_cache_bytes_per_block(arch, cc.block_size, dtype, shard) for shard in shards_of(config)
    )
    num_blocks = int(gib * 2**30) // per_block
    if num_blocks < 1:
        raise ValueError(f"kv_cache_memory_gib={gib} is smaller than one KV block ({per_block} bytes)")
    return num_blocks


def allocate_kv_cache(
    arch: ModelArchConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    shard: ShardSpec = WHOLE_MODEL,
    shared_pages: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zero-filled (k, v) pools for each layer of the shard's stage, over its own kv heads.

    ``shared_pages``: the engine's layout, where layers in the same slot of different KV-cache groups
    share one pool (drive the model with one block table per group); otherwise every layer has its own
    (one block table serves all layers).

    Zeros matter: padded decode rows read unused slots and mask them out with -inf, and 0 * NaN would
    still poison the output if an unused slot held NaN.
    """
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
    shape = kv_cache_shape(arch, num_blocks, block_size, shard)
    if not shared_pages:
        return [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(_num_layers(arch, shard))
        ]
    slots = layer_slots(arch.kv_cache_groups, *shard.layer_range(arch.num_hidden_layers))
    pools = [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(slots.num_slots)
    ]
    return [pools[s] for s in slots.slot_of]
