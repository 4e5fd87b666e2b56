"""Preallocated paged KV cache: (k, v) block pools for the layers of this shard.

The engine's layout shares pools between KV-cache groups (``sarathi.core.kv_groups``): a block id is a page
that belongs to one group at a time, and the layers in the same slot of different groups use one pool.
"""

from __future__ import annotations

import torch

from sarathi.config import DEFAULT_KV_CACHE_MEMORY_GIB, EngineConfig
from sarathi.core.kv_groups import layer_slots
from sarathi.model import huge_pages
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
        return _zeroed_pools(_num_layers(arch, shard), shape, dtype, device)
    slots = layer_slots(arch.kv_cache_groups, *shard.layer_range(arch.num_hidden_layers))
    pools = _zeroed_pools(slots.num_slots, shape, dtype, device)
    return [pools[s] for s in slots.slot_of]


def _zeroed_pools(
    count: int, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device | str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` zero-filled (k, v) pool pairs. On a CPU they are views of one region on huge pages
    (sarathi/model/huge_pages.py): a decode reads each sequence's blocks wherever they lie, a TLB miss per
    block on 4 KiB pages, and a software prefetch that misses the TLB does not fetch early (decode
    attention's, decode_attention_tasks.h). SmolLM2 Q4_1 decode steps of 8 / 32 sequences at 512 keys took
    0.97x / 0.96x the time on huge pages, and the attention kernel's prefetch of its next task 0.89x / 0.85x
    on huge pages but 0.97x / 0.96x on 4 KiB ones (Zen5)."""
    if torch.device(device).type != "cpu":
        return [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(count)
        ]
    region = huge_pages.zeros((count, 2, *shape), dtype)
    return [(region[i, 0], region[i, 1]) for i in range(count)]
