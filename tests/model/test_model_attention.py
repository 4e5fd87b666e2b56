"""Attention metadata, the paged KV cache and paged attention against a dense per-sequence reference."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_harness import SMALL_LLAMA

from sarathi.model import (
    ModelArchConfig,
    SeqSlice,
    allocate_kv_cache,
    build_attention_metadata,
    kv_cache_bytes_per_block,
)
from sarathi.model.paged_attention import GatherWorkspace, paged_attention, plan_cache_reads, write_kv


def _slot(s: SeqSlice, pos: int, block_size: int) -> int:
    return s.block_table[pos // block_size] * block_size + pos % block_size


MAX_SLICES, MAX_START, MAX_NUM = 6, 40, 17


@st.composite
def batches(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    n = draw(st.integers(1, MAX_SLICES))
    pool = list(range(MAX_SLICES * (MAX_START + MAX_NUM + 2)))  # enough blocks for the worst draw at size 1
    random.Random(draw(st.integers(0, 999))).shuffle(pool)
    slices = []
    for _ in range(n):
        start = draw(st.integers(0, MAX_START))
        num = draw(st.sampled_from([1, 1, 2, 5, MAX_NUM]))
        blocks = -(-(start + num) // block_size) + draw(st.integers(0, 2))  # tables may run past the need
        slices.append(SeqSlice([pool.pop() for _ in range(blocks)], start, num))
    return slices, block_size


@settings(max_examples=60, deadline=None)
@given(batches())
def test_metadata_matches_per_token_definition(batch) -> None:
    slices, bs = batch
    meta = build_attention_metadata(slices, bs)
    positions = [p for s in slices for p in range(s.start, s.start + s.num_tokens)]
    assert meta.positions.tolist() == positions
    assert meta.slot_mapping.tolist() == [
        _slot(s, p, bs) for s in slices for p in range(s.start, s.start + s.num_tokens)
    ]
    assert meta.num_tokens == sum(s.num_tokens for s in slices)

    decodes = [(s, r0) for s, r0 in zip(slices, _row_starts(slices), strict=True) if s.num_tokens == 1]
    prefills = [(s, r0) for s, r0 in zip(slices, _row_starts(slices), strict=True) if s.num_tokens > 1]
    assert len(meta.prefills) == len(prefills)
    for p, (s, r0) in zip(meta.prefills, prefills, strict=True):
        assert (p.token_start, p.token_end, p.context_len) == (r0, r0 + s.num_tokens, s.start + s.num_tokens)
        assert p.block_table.tolist() == s.block_table[: -(-p.context_len // bs)]
        if s.start == 0:
            assert p.mask is None
        else:  # query i sees keys <= start + i (causal, aligned to the end of the keys)
            q, k = torch.meshgrid(torch.arange(s.num_tokens), torch.arange(p.context_len), indexing="ij")
            assert torch.equal(p.mask, k <= q + s.start)
    if not decodes:
        assert meta.decode is None
        return
    dec = meta.decode
    assert dec.token_indices.tolist() == [r0 for _, r0 in decodes]
    assert dec.context_lens.tolist() == [s.start + 1 for s, _ in decodes]
    width = dec.block_tables.shape[1]
    assert width == max(-(-(s.start + 1) // bs) for s, _ in decodes)
    for row, (s, _) in enumerate(decodes):
        needed = -(-(s.start + 1) // bs)
        assert dec.block_tables[row, :needed].tolist() == s.block_table[:needed]
        visible = dec.attn_bias[row, 0] == 0
        assert visible.sum() == s.start + 1 and visible[: s.start + 1].all()
        assert torch.isneginf(dec.attn_bias[row, 0, s.start + 1 :]).all()


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([1, 3, 16, 20]))
def test_windowed_metadata_matches_per_token_definition(batch, window) -> None:
    """A sliding-window layer's view: query at position p sees keys (p - window, p], and prefill chunks read
    only the blocks from the one holding their earliest visible key."""
    slices, bs = batch
    meta = build_attention_metadata(slices, bs).windowed(window)
    prefills = [s for s in slices if s.num_tokens > 1]
    for p, s in zip(meta.prefills, prefills, strict=True):
        earliest = max(0, s.start - window + 1)
        assert p.first_key == earliest // bs * bs
        assert p.block_table.tolist() == s.block_table[p.first_key // bs : -(-p.context_len // bs)]
        q, k = torch.meshgrid(
            torch.arange(s.start, p.context_len), torch.arange(p.first_key, p.context_len), indexing="ij"
        )
        expected = (k <= q) & (k > q - window)
        if p.mask is None:  # plain causal over its own keys, which the window does not cut
            assert s.start == 0 and s.num_tokens <= window
        else:
            assert torch.equal(p.mask, expected)
    decodes = [s for s in slices if s.num_tokens == 1]
    if decodes:
        assert meta.decode.window == window
        for row, s in enumerate(decodes):
            visible = (meta.decode.attn_bias[row, 0] == 0).nonzero().flatten().tolist()
            assert visible == list(range(max(0, s.start + 1 - window), s.start + 1))


def _row_starts(slices: list[SeqSlice]) -> list[int]:
    starts, row = [], 0
    for s in slices:
        starts.append(row)
        row += s.num_tokens
    return starts


@pytest.mark.parametrize(
    ("slices", "message"),
    [([], "at least one"), ([SeqSlice([0], 10, 7)], "cannot hold 17"), ([SeqSlice([0], 0, 0)], "invalid")],
)
def test_metadata_rejects_bad_batches(slices, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_attention_metadata(slices, 16)


def test_kv_cache_is_zeroed_and_sized() -> None:
    arch = ModelArchConfig.from_hf_config(SMALL_LLAMA)
    for dtype in (torch.float32, torch.bfloat16):
        caches = allocate_kv_cache(arch, num_blocks=7, block_size=16, dtype=dtype)
        assert len(caches) == arch.num_hidden_layers
        k, v = caches[0]
        assert k.shape == v.shape == (arch.num_key_value_heads, 7, 16, arch.head_dim)
        assert k.dtype == dtype and not k.any() and not v.any()
        total = sum(t.numel() * t.element_size() for kv in caches for t in kv)
        assert kv_cache_bytes_per_block(arch, 16, dtype) * 7 == total


def _dense_reference(q, k, v, start):
    """Plain attention of one sequence: q [n, H, d] at positions start.., k/v [start + n, KVH, d]."""
    n, heads, d = q.shape
    rep = heads // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) / d**0.5
    allowed = torch.arange(start + n)[None, :] <= torch.arange(start, start + n)[:, None]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * d)


@pytest.mark.parametrize(
    ("dtype", "compute", "atol"),
    [
        (torch.float32, torch.float32, 1e-5),
        (torch.bfloat16, torch.bfloat16, 3e-2),
        (torch.bfloat16, torch.float32, 1e-5),  # bf16 cache read by fp32 math: exact on the stored values
    ],
)
def test_paged_attention_matches_dense(dtype, compute, atol) -> None:
    """History written first, then one batch mixing decodes and chunks (including a chunk from 0).

    The reference attends, in fp32, to the K/V values as the cache (of `dtype`) stores them.
    """
    torch.manual_seed(0)
    heads, kv_heads, d, bs, num_blocks = 6, 2, 8, 4, 64
    shape = (kv_heads, num_blocks, bs, d)
    k_cache, v_cache = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    pool = list(range(num_blocks))
    random.Random(1).shuffle(pool)
    entries = [(9, 1), (3, 6), (0, 5), (22, 1), (0, 1), (13, 3)]  # (start, new tokens)
    full_k = [torch.randn(s + n, kv_heads, d).to(compute) for s, n in entries]
    full_v = [torch.randn(s + n, kv_heads, d).to(compute) for s, n in entries]
    tables = [[pool.pop() for _ in range(-(-(s + n) // bs))] for s, n in entries]
    history = [SeqSlice(t, 0, s) for t, (s, _) in zip(tables, entries, strict=True) if s > 0]
    hist_meta = build_attention_metadata(history, bs)
    old_k = torch.cat([k[:s] for k, (s, _) in zip(full_k, entries, strict=True) if s > 0])
    old_v = torch.cat([v[:s] for v, (s, _) in zip(full_v, entries, strict=True) if s > 0])
    write_kv(k_cache, v_cache, old_k, old_v, hist_meta.slot_mapping)

    slices = [SeqSlice(t, s, n) for t, (s, n) in zip(tables, entries, strict=True)]
    meta = build_attention_metadata(slices, bs)
    q = torch.randn(meta.num_tokens, heads, d).to(compute)
    new_k = torch.cat([k[s:] for k, (s, _) in zip(full_k, entries, strict=True)])
    new_v = torch.cat([v[s:] for v, (s, _) in zip(full_v, entries, strict=True)])
    plan = plan_cache_reads(meta, k_cache, GatherWorkspace(), compute)
    out = paged_attention(q, new_k, new_v, k_cache, v_cache, meta, plan, d**-0.5)
    assert out.dtype == compute and out.shape == (meta.num_tokens, heads * d)
    row = 0
    for (start, n), k, v in zip(entries, full_k, full_v, strict=True):
        expected = _dense_reference(q[row : row + n], k.to(dtype), v.to(dtype), start)
        torch.testing.assert_close(out[row : row + n].float(), expected, atol=atol, rtol=0)
        row += n
