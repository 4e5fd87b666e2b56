"""Weights placed on memory advised for transparent huge pages (sarathi/model/huge_pages.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from model_harness import SMALL_LLAMA

from sarathi.model import allocate_kv_cache, huge_pages, kernels, quantized
from sarathi.model.config import ModelArchConfig
from sarathi.model.linear import Linear

needs_linux = pytest.mark.skipif(not huge_pages.supported(), reason="huge pages are advised on Linux only")


def vma_flags(address: int) -> set[str]:
    """The VmFlags of this process's mapping that holds `address` (from /proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def advised(t: torch.Tensor) -> bool:
    """Whether the first huge page of `t` is advised for huge pages ("hg": MADV_HUGEPAGE)."""
    return "hg" in vma_flags(t.data_ptr())


@needs_linux
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float16, torch.int8, torch.float32])
def test_empty_is_aligned_advised_and_usable(dtype):
    shape = (3, huge_pages.MIN_BYTES // 3 + 4097)  # odd sizes: not a whole number of pages
    t = huge_pages.empty(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert advised(t)
    t.fill_(1)
    assert bool((t == 1).all())


@needs_linux
def test_tail_past_the_last_whole_huge_page_is_not_advised():
    # a huge page over the tail would hold memory the tensor does not use
    t = huge_pages.empty((huge_pages.MIN_BYTES + 12345,), torch.uint8)
    assert advised(t)
    assert "hg" not in vma_flags(t.data_ptr() + huge_pages.MIN_BYTES)


def test_small_tensors_are_ordinary():
    small = huge_pages.empty((10,), torch.float32)
    assert small.shape == (10,) and small.dtype == torch.float32 and small.is_contiguous()
    placed = huge_pages.from_numpy(np.arange(10, dtype=np.int16))
    assert placed.tolist() == list(range(10))


@needs_linux
def test_from_numpy_keeps_values():
    view = np.arange(2048 * 1024, dtype=np.int32).reshape(2048, 1024).T  # a strided view
    placed = huge_pages.from_numpy(view)
    assert advised(placed) and placed.is_contiguous()
    assert np.array_equal(placed.numpy(), view)


@needs_linux
def test_memory_stays_alive_with_the_tensor():
    t = huge_pages.empty((huge_pages.MIN_BYTES,), torch.uint8).fill_(7)
    view = t[5:10]
    del t
    import gc

    gc.collect()
    assert view.tolist() == [7] * 5


@needs_linux
@pytest.mark.skipif(not kernels.portable_available(), reason="sarathi's CPU kernels unavailable")
def test_packed_quantized_weights_are_on_huge_pages_and_multiply_right():
    rows, cols = 4096, 2048  # Q4_0 codes: 4 MiB
    t = quantized.quantize(torch.randn(rows, cols) * 0.02, "Q4_0")
    packed = quantized.pack(quantized.unpack(t))
    assert advised(packed.codes)
    x = torch.randn(2, cols)
    ref = x.double() @ quantized.dequantize(quantized.unpack(t)).double().T
    torch.testing.assert_close(kernels.quant_linear(x, packed).double(), ref, rtol=1e-2, atol=2e-3)


@needs_linux
@pytest.mark.skipif(not kernels.available(), reason="sarathi's AVX512-BF16 kernels unavailable")
def test_bf16_packed_weight_is_on_huge_pages():
    layer = Linear(2048, 2048, bias=False, dtype=torch.bfloat16, compute_dtype=torch.bfloat16)
    layer.weight.data.copy_(torch.randn(2048, 2048))
    x = torch.randn(3, 2048).bfloat16()
    before = torch.nn.functional.linear(x.float(), layer.weight.float())
    assert layer.pack()
    assert advised(layer._bf16_packed)
    torch.testing.assert_close(layer(x), before, rtol=2e-2, atol=2e-2)


@needs_linux
@pytest.mark.parametrize("shared_pages", [False, True])
def test_kv_cache_pools_are_zeroed_views_of_one_advised_region(shared_pages):
    arch = ModelArchConfig.from_hf_config(SMALL_LLAMA)
    kv_heads, head_dim = arch.num_key_value_heads, arch.head_dim
    blocks = huge_pages.MIN_BYTES // (kv_heads * 16 * head_dim * 2) + 3  # each pool over MIN_BYTES
    caches = allocate_kv_cache(arch, blocks, 16, torch.bfloat16, shared_pages=shared_pages)
    assert len(caches) == arch.num_hidden_layers
    spans = []
    for k, v in caches:
        for t in (k, v):
            assert t.shape == (kv_heads, blocks, 16, head_dim) and t.is_contiguous() and not t.any()
            assert advised(t)
            spans.append((t.data_ptr(), t.data_ptr() + t.nbytes))
    spans = sorted(set(spans))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans)), "pools overlap"
    caches[0][0].fill_(1)  # writing one pool leaves the others zero
    assert not caches[0][1].any() and not caches[-1][0].any()
