"""Attention over a paged KV cache, for a flattened batch of prefill chunks and decodes.

Cache layout per layer: k and v are [num_kv_heads, num_blocks, block_size, head_dim]. Viewed as rows of
[num_kv_heads * num_blocks, block_size * head_dim], one row is one (kv head, block): reading a sequence's
context is a single `index_select` of whole blocks, and its result is already laid out as
[sequences * kv_heads, keys, head_dim], the batch-of-matrices shape that grouped matmuls want. Decodes skip
that gather where our kernel runs (`kernels.decode_attention` reads the blocks in place), and so do prefill
chunks in the bf16 fast path (`kernels.chunk_attention`: bf16 products, float32 sums and softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sarathi.model import kernels
from sarathi.model.attention import AttentionMetadata, PrefillAttention


class GatherWorkspace:
    """Reusable destination buffers for K/V rows gathered from the cache, one pair per dtype.

    A fresh 10-100 MB tensor per layer and call is served by mmap and pays page faults on first touch:
    measured ~6x slower gathers and a 2.5x slower whole step (SmolLM2 fp32, 32 decodes of 512 tokens).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, numel: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Two flat buffers of at least `numel` elements of `dtype` on `device`."""
        key = (dtype, device)
        pair = self._buffers.get(key)
        if pair is None or pair[0].numel() < numel:
            pair = tuple(torch.empty(numel, dtype=dtype, device=device) for _ in range(2))
            self._buffers[key] = pair
        return pair[0][:numel], pair[1][:numel]


@dataclass(frozen=True)
class CacheReadPlan:
    """Per-forward row indices into the cache viewed as [kv_heads * num_blocks, block_size * head_dim]."""

    decode_rows: torch.Tensor | None  # LongTensor[B * kv_heads * max_blocks], ordered (seq, head, block)
    decode_bias: torch.Tensor | None  # float32[B * kv_heads, 1, max_blocks * block_size]
    decode_in_place: bool  # decodes read the cache in place with our kernel (then no rows or bias above)
    decode_tables: torch.Tensor | None  # LongTensor[B, max_blocks], for the kernel
    chunks_in_place: bool  # prefill chunks read the cache in place with our chunk kernel (then no rows)
    decode_lens: torch.Tensor | None  # LongTensor[B]
    prefill_rows: tuple[torch.Tensor | None, ...]  # per prefill chunk, ordered (head, block); None if start 0
    decode_window: int  # > 0: decodes see only their `decode_window` latest keys
    k_buffer: torch.Tensor | None  # flat, cache dtype, large enough for the biggest gather (None: no gather)
    v_buffer: torch.Tensor | None
    k_upcast: torch.Tensor | None  # same size in the compute dtype, when the cache holds a narrower one
    v_upcast: torch.Tensor | None


def plan_cache_reads(
    meta: AttentionMetadata,
    k_cache: torch.Tensor,
    workspace: GatherWorkspace,
    compute_dtype: torch.dtype,
    bf16_chunks: bool = False,
) -> CacheReadPlan:
    """Compute, once per forward, which cache rows each attention group reads (shared by all layers).

    `bf16_chunks`: the model computes in the bf16 fast path, so prefill chunks may attend with bf16
    products (our chunk kernel, where it serves this cache); otherwise they attend in `compute_dtype`.
    """
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    decode_rows = decode_bias = decode_tables = decode_lens = None
    in_place = meta.decode is not None and decode_kernel_serves(k_cache, compute_dtype)
    chunks_in_place = bf16_chunks and bool(meta.prefills) and chunk_kernel_serves(k_cache)
    gathers = (meta.decode is not None and not in_place) or any(
        p.reads_cache and not chunks_in_place for p in meta.prefills
    )
    # (a decode step read in place, the common case, makes no tensor here: each op costs ~10 us after the
    # weights streamed by the previous step left every cache cold)
    head_offsets = torch.arange(kv_heads, device=meta.positions.device) * num_blocks if gathers else None
    if in_place:
        decode_tables, decode_lens = meta.decode.block_tables, meta.decode.context_lens
    elif meta.decode is not None:
        tables = meta.decode.block_tables
        decode_rows = (tables[:, None, :] + head_offsets[None, :, None]).reshape(-1)
        decode_bias = meta.decode.attn_bias.repeat_interleave(kv_heads, dim=0)
    prefill_rows = tuple(
        (p.block_table[None, :] + head_offsets[:, None]).reshape(-1)
        if p.reads_cache and not chunks_in_place
        else None
        for p in meta.prefills
    )
    k_buffer = v_buffer = k_upcast = v_upcast = None
    if gathers:
        most_rows = max(r.numel() for r in (decode_rows, *prefill_rows) if r is not None)
        numel = most_rows * block_size * head_dim
        k_buffer, v_buffer = workspace.get(numel, k_cache.dtype, k_cache.device)
        if compute_dtype != k_cache.dtype:
            k_upcast, v_upcast = workspace.get(numel, compute_dtype, k_cache.device)
    return CacheReadPlan(
        decode_rows,
        decode_bias,
        in_place,
        decode_tables,
        chunks_in_place,
        decode_lens,
        prefill_rows,
        meta.decode.window if meta.decode is not None else 0,
        k_buffer,
        v_buffer,
        k_upcast,
        v_upcast,
    )


def decode_kernel_serves(k_cache: torch.Tensor, compute_dtype: torch.dtype) -> bool:
    """Whether our decode-attention kernel handles this cache (float32 math; head_dim a multiple of 16)."""
    head_dim = k_cache.shape[-1]
    return (
        compute_dtype == torch.float32
        and k_cache.is_cpu
        and k_cache.dtype in (torch.float32, torch.bfloat16)
        and head_dim % 16 == 0
        and head_dim <= 256
        and kernels.portable_available()
    )


def chunk_kernel_serves(k_cache: torch.Tensor) -> bool:
    """Whether our chunk-attention kernel handles this cache (bf16; head_dim a multiple of 16)."""
    return (
        k_cache.is_cpu
        and k_cache.dtype == torch.bfloat16
        and k_cache.shape[-1] % 16 == 0
        and kernels.available()
    )


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store the new tokens' k, v ([T, kv_heads, head_dim]) at their slots (rounded to the cache dtype)."""
    kv_heads, _, _, head_dim = k_cache.shape
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_cache.view(kv_heads, -1, head_dim).index_copy_(1, slot_mapping, k.transpose(0, 1))
    v_cache.view(kv_heads, -1, head_dim).index_copy_(1, slot_mapping, v.transpose(0, 1))


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    plan: CacheReadPlan,
    scale: float,
    written: bool = False,
) -> torch.Tensor:
    """Write k, v into the cache, then attend q [T, heads, head_dim]; returns [T, heads * head_dim].

    A cache narrower than q (bf16 cache, fp32 compute) is read back upcast; new keys are attended to as the
    cache stores them too, so how a prompt is chunked does not change what any query sees. `written` says
    the caller has stored them already (`kernels.rope_write_kv`): k, v are then the stored values, widened,
    and may be None when no prefill chunk starts at 0 (only those read k, v rather than the cache).
    """
    if not written:
        k_stored, v_stored = k.to(k_cache.dtype), v.to(v_cache.dtype)  # no-ops when the dtypes match
        write_kv(k_cache, v_cache, k_stored, v_stored, meta.slot_mapping)
        if k_stored.dtype != k.dtype:
            k, v = k_stored.to(k.dtype), v_stored.to(v.dtype)
    dec = meta.decode
    if not meta.prefills:  # all rows are decodes, already in order
        return decode_attention(q, k_cache, v_cache, plan, scale)
    chunks = [
        _chunk_attention(q, k, v, k_cache, v_cache, p, rows, plan, scale)
        for p, rows in zip(meta.prefills, plan.prefill_rows, strict=True)
    ]
    if dec is None and len(chunks) == 1:  # one chunk is the whole batch
        return chunks[0]
    num_tokens, heads, head_dim = q.shape
    out = q.new_empty(num_tokens, heads * head_dim)
    for p, chunk_out in zip(meta.prefills, chunks, strict=True):
        out[p.token_start : p.token_end] = chunk_out
    if dec is not None:
        decoded = decode_attention(q.index_select(0, dec.token_indices), k_cache, v_cache, plan, scale)
        out.index_copy_(0, dec.token_indices, decoded)
    return out


def _chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    p: PrefillAttention,
    rows: torch.Tensor | None,
    plan: CacheReadPlan,
    scale: float,
) -> torch.Tensor:
    """A prefill chunk over its keys: its own new k, v when it starts at 0, else its blocks in the cache
    (read in place by our kernel where the plan says so, for every chunk)."""
    rows_of_chunk = slice(p.token_start, p.token_end)
    if plan.chunks_in_place:
        start = p.context_len - p.num_tokens
        return kernels.chunk_attention(
            q[rows_of_chunk], k_cache, v_cache, p.block_table, p.first_key, start, p.window, scale
        )
    if rows is None:
        keys, values = k[rows_of_chunk].transpose(0, 1), v[rows_of_chunk].transpose(0, 1)
    else:
        kv_heads = k_cache.shape[0]
        num_keys = p.context_len - p.first_key
        keys = _read_rows(k_cache, rows, kv_heads, plan.k_buffer, plan.k_upcast)[:, :num_keys]
        values = _read_rows(v_cache, rows, kv_heads, plan.v_buffer, plan.v_upcast)[:, :num_keys]
    return prefill_attention(q[rows_of_chunk], keys, values, p.mask, scale)


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """One chunk: q [n, heads, d] over k, v [kv_heads, keys, d]; mask None means causal with keys == n.

    SDPA with enable_gqa (no K/V expansion) measured at least as fast as grouped matmuls for chunks of
    16-256 tokens in fp32 and bf16 on the target CPU, and accumulates in fp32.
    """
    n, heads, d = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k[None],
        v[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).reshape(n, heads * d)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: CacheReadPlan, scale: float
) -> torch.Tensor:
    """B one-token queries [B, heads, d] over their contexts: our kernel reading the cache in place where the
    plan says so (float32 [B, heads * d]), else two grouped batched matmuls over padded gathered contexts.

    Each query head group (the heads sharing one kv head) is a [rep, d] matrix, so no K/V expansion is
    needed; softmax is in float32. On the target CPU this is ~4x faster than SDPA in bf16 and on par in fp32.
    """
    if plan.decode_in_place:
        return kernels.decode_attention(
            q, k_cache, v_cache, plan.decode_tables, plan.decode_lens, scale, plan.decode_window
        )
    batch, heads, d = q.shape
    kv_heads = k_cache.shape[0]
    groups = batch * kv_heads
    keys = _read_rows(k_cache, plan.decode_rows, groups, plan.k_buffer, plan.k_upcast)  # [groups, L, d]
    values = _read_rows(v_cache, plan.decode_rows, groups, plan.v_buffer, plan.v_upcast)
    grouped_q = q.reshape(batch * kv_heads, heads // kv_heads, d)
    scores = torch.bmm(grouped_q, keys.transpose(1, 2))
    probs = torch.softmax(torch.add(plan.decode_bias, scores.float(), alpha=scale), dim=-1)
    out = torch.bmm(probs.to(q.dtype), values)
    return out.view(batch, heads * d)


def _read_rows(
    cache: torch.Tensor,
    rows: torch.Tensor,
    groups: int,
    buffer: torch.Tensor,
    upcast: torch.Tensor | None,
) -> torch.Tensor:
    """Gather whole (kv head, block) rows of the cache into `buffer`, then convert them into `upcast`, if any.

    Returns a [groups, rows / groups * block_size, d] view of the buffer holding the result.
    """
    kv_heads, num_blocks, block_size, d = cache.shape
    numel = rows.numel() * block_size * d
    out = buffer[:numel].view(rows.numel(), block_size * d)
    torch.index_select(cache.view(kv_heads * num_blocks, block_size * d), 0, rows, out=out)
    if upcast is not None:
        out = upcast[:numel].view_as(out).copy_(out)
    return out.view(groups, -1, d)
