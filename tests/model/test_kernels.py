"""Our C++ kernels against float64 references computed with PyTorch: the bf16 GEMM (bf16 inputs, float32
accumulation and output), decode attention over a paged cache read in place, and prefill-chunk attention
(bf16 products, float32 sums) over the same cache. Decode attention and the RoPE + cache write also run on
CPUs without AVX512-BF16 (their AVX2 builds), so their tests run there too.

Shapes cover odd row counts, widths that are not a multiple of the kernel's 16-column blocks, batch sizes
1 / 7 / 64, contexts ending on and off block boundaries, and both compiled and generic attention groupings.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sarathi.model import kernels
from sarathi.model.linear import Linear

needs_avx512 = pytest.mark.skipif(not kernels.available(), reason="kernels need a compiler and AVX512-BF16")
needs_avx2 = pytest.mark.skipif(not kernels.portable_available(), reason="kernels need a compiler and AVX2")
# The fused steps' result dtypes: bf16 (bf16 math, AVX-512) and float32 (float32 layers, AVX2).
RESULT_DTYPES = [
    pytest.param(torch.bfloat16, marks=needs_avx512, id="bf16"),
    pytest.param(torch.float32, marks=needs_avx2, id="f32"),
]


def _relative_tolerance(dtype: torch.dtype) -> float:
    """Float32 math differing by an ulp can round to the neighbouring bf16 value, never further; float32
    results differ from torch's by a few ulps (another summation order, our exp)."""
    return 2**-7 if dtype == torch.bfloat16 else 4e-6


@needs_avx512
@pytest.mark.parametrize("rows", [0, 1, 2, 7, 13, 64, 255])
@pytest.mark.parametrize("in_features,out_features", [(576, 960), (64, 50), (1536, 576), (32, 16), (96, 100)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_is_exact_float32_accumulation_of_bf16_products(rows, in_features, out_features, bias):
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    w = torch.randn(out_features, in_features, generator=g).bfloat16()
    x = torch.randn(rows, in_features, generator=g).bfloat16()
    b = torch.randn(out_features, generator=g) if bias else None
    y = kernels.gemm(x, kernels.pack(w), out_features, b)
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    assert y.dtype == torch.float32 and y.shape == (rows, out_features)
    # bf16 x bf16 products are exact in float32; only float32 summation order differs from float64.
    scale = max(1.0, ref.abs().max().item()) if rows else 1.0
    assert torch.allclose(y.double(), ref, rtol=0, atol=1e-5 * in_features**0.5 * scale)


@needs_avx512
def test_gemm_rounds_float32_inputs_to_bf16_and_keeps_leading_dims():
    w = torch.randn(48, 64).bfloat16()
    x = torch.randn(2, 3, 64)
    y = kernels.gemm(x, kernels.pack(w), 48, None)
    assert y.shape == (2, 3, 48)
    ref = x.bfloat16().double() @ w.double().T
    assert (y.double() - ref).abs().max() < 1e-4


@needs_avx512
def test_gemm_refuses_mismatched_shapes():
    packed = kernels.pack(torch.randn(32, 64).bfloat16())
    with pytest.raises(RuntimeError, match="features"):
        kernels.gemm(torch.randn(4, 62).bfloat16(), packed, 32, None)
    with pytest.raises(RuntimeError, match="even"):
        kernels.pack(torch.randn(32, 63).bfloat16())


@needs_avx512
def test_bf16_linear_uses_the_kernel_with_float32_output():
    layer = Linear(64, 40, True, torch.bfloat16)
    layer.weight.copy_(torch.randn(40, 64))
    layer.bias.copy_(torch.randn(40))
    w, b = layer.weight.detach().clone(), layer.bias.detach().clone()
    assert layer.pack() and layer.output_dtype == torch.float32
    x = torch.randn(7, 64).bfloat16()
    y = layer(x)
    assert y.dtype == torch.float32
    assert (y.double() - (x.double() @ w.double().T + b.double())).abs().max() < 1e-4


def _reference_attention(q, k_cache, v_cache, tables, lens, scale, window=0):
    batch, heads, d = q.shape
    kv_heads, _, block_size, _ = k_cache.shape
    rep = heads // kv_heads
    out = torch.empty(batch, heads * d, dtype=torch.float64)
    for b in range(batch):
        n = int(lens[b])
        blocks = tables[b][: -(-n // block_size)]
        k = k_cache[:, blocks].reshape(kv_heads, -1, d)[:, :n].double().repeat_interleave(rep, 0)
        v = v_cache[:, blocks].reshape(kv_heads, -1, d)[:, :n].double().repeat_interleave(rep, 0)
        if window:
            k, v = k[:, max(0, n - window) :], v[:, max(0, n - window) :]
        probs = (torch.einsum("hd,hkd->hk", q[b].double(), k) * scale).softmax(-1)
        out[b] = torch.einsum("hk,hkd->hd", probs, v).reshape(-1)
    return out


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,lens",
    [
        (9, 3, 64, 16, [1]),  # SmolLM2's grouping, batch 1, one key
        (9, 3, 64, 16, [1, 15, 16, 17, 100, 512, 33]),  # batch 7, around block boundaries
        (8, 2, 128, 5, [7, 10, 11]),  # odd block size
        (4, 4, 64, 16, list(range(1, 65))),  # batch 64, every context length 1..64
        (32, 8, 128, 16, [300, 4]),
        (12, 1, 48, 16, [40, 3]),  # generic path: head_dim 48, 12 heads per kv head
        (4, 1, 256, 16, [1, 300, 17]),  # Gemma 3's shape: head_dim 256, one kv head
        (2, 1, 64, 16, [2000, 129]),  # 16 spans of 128 keys merged
    ],
)
@needs_avx2
@pytest.mark.parametrize("window", [0, 16, 37])  # 0: no sliding window
def test_decode_attention_matches_reference(cache_dtype, heads, kv_heads, head_dim, block_size, lens, window):
    g = torch.Generator().manual_seed(len(lens) * 100 + heads)
    batch, num_blocks = len(lens), 160
    k_cache = (torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=g) * 2).to(cache_dtype)
    v_cache = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=g).to(cache_dtype)
    width = -(-max(lens) // block_size) + 1  # padded like the engine's block tables
    tables = torch.stack([torch.randperm(num_blocks, generator=g)[:width] for _ in range(batch)])
    q = torch.randn(batch, heads, head_dim, generator=g)
    lens_t = torch.tensor(lens)
    out = kernels.decode_attention(q, k_cache, v_cache, tables, lens_t, head_dim**-0.5, window)
    ref = _reference_attention(q, k_cache, v_cache, tables, lens_t, head_dim**-0.5, window)
    assert out.dtype == torch.float32 and out.shape == (batch, heads * head_dim)
    assert (out.double() - ref).abs().max() < 1e-5


@needs_avx2
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_decode_attention_of_a_row_does_not_depend_on_its_batch(head_dim):
    """Contexts are split into 128-key spans at fixed positions (so one sequence keeps every thread busy) and
    merged: a row alone and the same row among others of any lengths are bit for bit equal."""
    g = torch.Generator().manual_seed(head_dim)
    k_cache = torch.randn(2, 80, 16, head_dim, generator=g).bfloat16()
    v_cache = torch.randn(2, 80, 16, head_dim, generator=g).bfloat16()
    tables = torch.randperm(80, generator=g)[:50][None, :]
    q = torch.randn(1, 6, head_dim, generator=g)
    for window in (0, 200):
        one = kernels.decode_attention(q, k_cache, v_cache, tables, torch.tensor([300]), 0.1, window)
        lens = torch.tensor([1, 300, 129, 700, 300])
        batch = kernels.decode_attention(
            torch.cat([torch.randn(1, 6, head_dim, generator=g), q.repeat(4, 1, 1)]),
            k_cache,
            v_cache,
            tables.repeat(5, 1),
            lens,
            0.1,
            window,
        )
        assert torch.equal(one[0], batch[1]) and torch.equal(one[0], batch[4])


@needs_avx2
def test_decode_attention_refuses_contexts_outside_the_table():
    k = torch.zeros(1, 4, 16, 64, dtype=torch.bfloat16)
    tables = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="context length"):
        kernels.decode_attention(torch.zeros(1, 2, 64), k, k, tables, torch.tensor([33]), 0.1)
    with pytest.raises(RuntimeError, match="context length"):
        kernels.decode_attention(torch.zeros(1, 2, 64), k, k, tables, torch.tensor([0]), 0.1)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size",
    [(9, 3, 64, 16), (4, 1, 256, 16), (8, 2, 128, 5), (16, 16, 32, 16), (32, 2, 64, 16)],
)
@pytest.mark.parametrize(
    "start,tokens,window",
    [
        (0, 1, 0),
        (0, 37, 0),  # a whole prompt, several tiles
        (15, 2, 0),  # straddles a block boundary
        (700, 16, 0),
        (100, 130, 0),
        (20, 40, 16),  # every query's window starts inside the chunk's cached keys or its own
        (300, 33, 64),
        (50, 9, 512),  # the window longer than the context
    ],
)
@needs_avx512
def test_chunk_attention_matches_reference(heads, kv_heads, head_dim, block_size, start, tokens, window):
    """Each query of a chunk sees the keys up to its own position (within the window): the float64 result
    of the same attention on the bf16-rounded scaled queries, up to the rounding of the softmax weights."""
    g = torch.Generator().manual_seed(start * 7 + tokens + heads)
    context = start + tokens
    blocks = -(-context // block_size)
    num_blocks = blocks + 9
    k_cache = (torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=g) * 2).bfloat16()
    v_cache = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=g).bfloat16()
    table = torch.randperm(num_blocks, generator=g)[:blocks]
    q = torch.randn(tokens, heads, head_dim, generator=g)
    scale = head_dim**-0.5
    first_key = max(0, start - window + 1) // block_size * block_size if window else 0
    out = kernels.chunk_attention(
        q, k_cache, v_cache, table[first_key // block_size :], first_key, start, window, scale
    )
    tables = table[None].expand(tokens, -1)
    lens = torch.arange(start + 1, context + 1)
    rounded = (q * scale).bfloat16().float()
    ref = _reference_attention(rounded, k_cache, v_cache, tables, lens, 1.0, window)
    exact = _reference_attention(q, k_cache, v_cache, tables, lens, scale, window)
    assert out.dtype == torch.float32 and out.shape == (tokens, heads * head_dim)
    assert (out.double() - ref).abs().max() < 4e-3  # |v| < ~5: weights rounded to bf16 (2^-9 relative)
    assert (out.double() - exact).norm() < 1e-2 * exact.norm()


@needs_avx512
def test_chunk_attention_refuses_bad_geometry():
    k = torch.zeros(1, 4, 16, 64, dtype=torch.bfloat16)
    q = torch.zeros(3, 2, 64)
    with pytest.raises(RuntimeError, match="block table"):
        kernels.chunk_attention(q, k, k, torch.tensor([0, 1]), 0, 40, 0, 0.1)
    with pytest.raises(RuntimeError, match="first_key"):
        kernels.chunk_attention(q, k, k, torch.tensor([1, 2]), 16, 40, 0, 0.1)
    with pytest.raises(RuntimeError, match="bf16"):
        kernels.chunk_attention(q, k.float(), k.float(), torch.tensor([0, 1]), 0, 10, 0, 0.1)
    with pytest.raises(RuntimeError, match="block id"):
        kernels.chunk_attention(q, k, k, torch.tensor([0, 9]), 0, 10, 0, 0.1)


@needs_avx512
@pytest.mark.parametrize("shape", [(64, 49152), (1, 49152), (7, 50), (3, 5), (5, 17), (3, 64), (4, 129)])
def test_argmax_rows_is_torch_argmax(shape):
    g = torch.Generator().manual_seed(shape[1])
    for x in (torch.randn(shape, generator=g), torch.randint(0, 3, shape, generator=g).float()):  # ties too
        assert torch.equal(kernels.argmax_rows(x), x.argmax(-1))


@needs_avx512
def test_argmax_rows_first_tie_and_nan_like_torch():
    x = torch.zeros(5, 200)
    x[1, 30] = x[1, 170] = 1.0  # a tie: the first wins
    x[2, 140] = x[2, 190] = float("nan")  # NaN is the largest; its first occurrence wins
    x[3, 5], x[3, 99] = float("inf"), float("nan")
    x[4] = float("-inf")
    assert kernels.argmax_rows(x).tolist() == x.argmax(-1).tolist() == [0, 30, 140, 99, 0]


def _run_with_kernels_setting(setting: str, code: str) -> None:
    """Runs `code` (which prints 'ok' at its end) in a fresh process with SARATHI_KERNELS=setting; it must
    succeed and print the one-line notice naming the setting."""
    env = {**os.environ, "SARATHI_KERNELS": setting}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    assert f"SARATHI_KERNELS={setting}" in done.stderr


@needs_avx512
def test_without_kernels_pytorch_serves_and_auto_means_float32():
    """SARATHI_KERNELS=0 (as on a CPU without AVX512-BF16): a notice, PyTorch's kernels, and `auto` compute
    resolving to float32; explicit bf16 math still runs (on oneDNN's bf16 GEMMs)."""
    code = (
        "import torch\n"
        "from sarathi import LLM, SamplingParams\n"
        "from sarathi.model import kernels\n"
        "assert not kernels.available() and kernels.status() == 'none (SARATHI_KERNELS=0)'\n"
        "p = SamplingParams(temperature=0.0, max_tokens=8)\n"
        "for compute, expected in (('auto', torch.float32), ('bfloat16', torch.bfloat16)):\n"
        "    llm = LLM(num_kv_blocks=32, max_model_len=128, compute_dtype=compute)\n"
        "    assert llm.engine.executor.worker.model.compute_dtype == expected\n"
        "    out = llm.generate('The capital of France is', p, use_tqdm=False)[0]\n"
        "    assert 'Paris' in out.text, out.text\n"
        "print('ok')\n"
    )
    _run_with_kernels_setting("0", code)


@needs_avx512
@pytest.mark.parametrize("setting", ["avx2", "vnni", "avx512bw"])
def test_forced_avx2_builds_serve_the_quantized_model(setting):
    """SARATHI_KERNELS=avx2 (or vnni, avx512bw) on an AVX-512 CPU: the AVX2 builds run, as on a CPU without
    AVX512-BF16 (with vnni: the quantized products on AVX-512 VNNI, as on an Intel Cascade Lake or Ice Lake;
    with avx512bw on AVX-512 without VNNI, as on a Skylake-SP),
    so those paths are exercised here too: a notice, `auto` compute resolving to float32, the embedded model
    served from its Q4_1 blocks through the quantized kernel."""
    code = (
        "import torch\n"
        "from sarathi import LLM, SamplingParams\n"
        "from sarathi.model import kernels\n"
        "assert not kernels.available() and kernels.portable_available()\n"
        f"assert kernels.status() == '{setting} (SARATHI_KERNELS={setting})', kernels.status()\n"
        "llm = LLM(num_kv_blocks=32, max_model_len=128)\n"
        "model = llm.engine.executor.worker.model\n"
        "assert model.compute_dtype == torch.float32 and model.quantized_layers(), model.quantized_layers()\n"
        "p = SamplingParams(temperature=0.0, max_tokens=8)\n"
        "out = llm.generate('The capital of France is', p, use_tqdm=False)[0]\n"
        "assert 'Paris' in out.text, out.text\n"
        "print('ok')\n"
    )
    _run_with_kernels_setting(setting, code)


@pytest.mark.parametrize("dtype", RESULT_DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 7, 64])
@pytest.mark.parametrize("width", [1536, 40, 17])
def test_silu_mul_is_the_rounded_torch_result(dtype, rows, width):
    g = torch.Generator().manual_seed(rows + width)
    gate_up = torch.randn(rows, 2 * width, generator=g) * 4
    expected = (torch.nn.functional.silu(gate_up[:, :width]) * gate_up[:, width:]).to(dtype)
    got = kernels.silu_mul(gate_up, dtype)
    assert got.dtype == dtype and got.shape == (rows, width)
    tol = _relative_tolerance(dtype)
    assert (got.float() - expected.float()).abs().le(expected.float().abs() * tol + 1e-30).all()


@pytest.mark.parametrize("dtype", RESULT_DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 7, 64])
@pytest.mark.parametrize("width", [576, 40, 17])
@pytest.mark.parametrize("add", [False, True])
def test_add_rms_norm_updates_the_residual_and_normalizes(dtype, rows, width, add):
    g = torch.Generator().manual_seed(rows * 7 + width)
    residual = torch.randn(rows, width, generator=g) * 3
    x = torch.randn(rows, width, generator=g) if add else None
    weight = torch.rand(width, generator=g) + 0.5
    summed = residual + x if add else residual.clone()
    expected = torch.nn.functional.rms_norm(summed, (width,), weight, 1e-5).to(dtype)
    got = kernels.add_rms_norm(residual, x, weight, 1e-5, dtype)
    assert got.dtype == dtype and torch.equal(residual, summed)  # updated in place
    tol = _relative_tolerance(dtype)
    assert (got.float() - expected.float()).abs().le(expected.float().abs() * tol + 1e-30).all()


@needs_avx2
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 7, 64])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
def test_rope_write_kv_is_rope_then_the_cache_write(cache_dtype, tokens, heads, kv_heads, head_dim):
    from sarathi.model.paged_attention import write_kv
    from sarathi.model.rope import apply_rope, rope_cos_sin, rope_inv_freq

    g = torch.Generator().manual_seed(tokens * 31 + head_dim)
    blocks, block_size = 12, 16
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=g) * 3
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(head_dim, 10000.0))
    slots = torch.randperm(blocks * block_size, generator=g)[:tokens]  # any slots, across block boundaries
    shape = (kv_heads, blocks, block_size, head_dim)
    k_cache, v_cache = (
        torch.randn(shape, generator=g).to(cache_dtype),
        torch.randn(shape, generator=g).to(cache_dtype),
    )
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    qk = apply_rope(qkv[:, : heads + kv_heads], cos, sin)
    write_kv(ref_k, ref_v, qk[:, heads:], qkv[:, heads + kv_heads :], slots)

    q, k, v = kernels.rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads, True)
    # float32 rounding of x*cos + swap(x)*sin may differ by an ulp (a fused multiply-add), which can move a
    # bf16-rounded value to its neighbour, never further
    ulp = 2**-7 if cache_dtype == torch.bfloat16 else 2**-20
    assert torch.allclose(q, qk[:, :heads], rtol=2**-20, atol=1e-6)
    assert (k_cache.float() - ref_k.float()).abs().le(ref_k.float().abs() * ulp + 1e-6).all()
    assert torch.equal(v_cache, ref_v)  # v is only rounded to the cache dtype
    written = (slots // block_size, slots % block_size)
    assert torch.equal(k, k_cache[:, written[0], written[1]].float().transpose(0, 1))  # as stored
    assert torch.equal(v, v_cache[:, written[0], written[1]].float().transpose(0, 1))
    untouched = torch.ones(blocks * block_size, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(
        k_cache.view(kv_heads, -1, head_dim)[:, untouched], ref_k.view(kv_heads, -1, head_dim)[:, untouched]
    )

    _, none_k, none_v = kernels.rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads, False)
    assert none_k is None and none_v is None


@needs_avx2
def test_rope_write_kv_refuses_bad_shapes_and_slots():
    qkv, cos, sin = torch.randn(2, 5, 64), torch.randn(2, 1, 64), torch.randn(2, 1, 64)
    cache = torch.zeros(1, 4, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="slot outside"):
        kernels.rope_write_kv(qkv, cos, sin, cache, cache.clone(), torch.tensor([0, 64]), 3, False)
    with pytest.raises(RuntimeError, match="do not split"):
        kernels.rope_write_kv(qkv, cos, sin, cache, cache.clone(), torch.tensor([0, 1]), 2, False)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.rope_write_kv(
            torch.randn(2, 5, 48), cos, sin, cache, cache.clone(), torch.tensor([0, 1]), 3, False
        )


@needs_avx512
@pytest.mark.parametrize("vocab", [100, 262144, 49152 + 7])
def test_mask_logits_by_bitmask_matches_unpacked_bits(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=g, dtype=torch.int64).to(torch.int32)
    bitmask[0, : words // 2] = -1  # fully allowed words are skipped
    rows = torch.tensor([4, 0, 2])
    expected = logits.clone()
    bits = ((bitmask.long().unsqueeze(-1) >> torch.arange(32)) & 1).view(3, -1)[:, :vocab].bool()
    expected[rows] = torch.where(bits, logits[rows], float("-inf"))
    out = logits.clone()
    kernels.mask_logits_by_bitmask(out, bitmask, rows)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", RESULT_DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 7, 64])
@pytest.mark.parametrize("width", [2048, 40, 17])
def test_gelu_mul_is_the_rounded_exact_result(dtype, rows, width):
    g = torch.Generator().manual_seed(rows + width)
    gate_up = torch.randn(rows, 2 * width, generator=g) * 4
    gate, up = gate_up.double()[:, :width], gate_up.double()[:, width:]
    # float64 in the sigmoid form (0.5 * (1 + tanh(z)) = sigmoid(2z)): the tanh form cancels to 0 for
    # negative gates, in float32 (torch) and float64 alike
    exact = gate * torch.sigmoid(2 * (2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3)) * up
    got = kernels.gelu_mul(gate_up, dtype)
    assert got.dtype == dtype and got.shape == (rows, width)
    # float32 results: e^z is conditioned by |z| (a float32 z carries |z| * 2^-24 of error), up to ~1e-5
    # relative for the most negative gates here
    tol = 2**-7 if dtype == torch.bfloat16 else 3e-5
    assert (got.double() - exact).abs().le(exact.abs() * tol + 1e-30).all()
    torch_gelu = (torch.nn.functional.gelu(gate_up[:, :width], approximate="tanh") * gate_up[:, width:]).to(
        dtype
    )
    # and torch's own result but where its tanh form cancels (|gate| > ~5: off by up to ~1e-6 there)
    assert (got.float() - torch_gelu.float()).abs().le(torch_gelu.float().abs() * tol + 1e-5).all()


@pytest.mark.parametrize("dtype", RESULT_DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 7, 64])
@pytest.mark.parametrize("width", [640, 40, 17])
@pytest.mark.parametrize("next_norm", [False, True])
def test_norm_add_rms_norm_is_gemmas_sandwich_step(dtype, rows, width, next_norm):
    g = torch.Generator().manual_seed(rows * 5 + width)
    residual = torch.randn(rows, width, generator=g) * 3
    x = torch.randn(rows, width, generator=g) * 40
    w_x, w_next = torch.rand(width, generator=g) + 0.5, torch.rand(width, generator=g) + 0.5
    summed = residual + torch.nn.functional.rms_norm(x, (width,), w_x, 1e-6)
    got = kernels.norm_add_rms_norm(residual, x, w_x, w_next if next_norm else None, 1e-6, dtype)
    assert torch.allclose(residual, summed, rtol=1e-6, atol=1e-6)  # updated in place
    if not next_norm:
        assert got is None
        return
    # normalized from the residual as updated (its float32 sums may differ from torch's in the last bit,
    # which a float32 result would show where a sum nearly cancels)
    expected = torch.nn.functional.rms_norm(residual, (width,), w_next, 1e-6).to(dtype)
    tol = _relative_tolerance(dtype)
    assert got.dtype == dtype
    assert (got.float() - expected.float()).abs().le(expected.float().abs() * tol + 1e-30).all()


@needs_avx2
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 7])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 1, 256), (8, 2, 128)])
def test_rope_write_kv_with_qk_norm_normalizes_each_head_first(
    cache_dtype, tokens, heads, kv_heads, head_dim
):
    from sarathi.model.paged_attention import write_kv
    from sarathi.model.rope import apply_rope, rope_cos_sin, rope_inv_freq

    g = torch.Generator().manual_seed(tokens * 17 + head_dim)
    blocks, block_size = 4, 16
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=g) * 5
    q_w, k_w = torch.rand(head_dim, generator=g) + 0.5, torch.rand(head_dim, generator=g) + 0.5
    cos, sin = rope_cos_sin(torch.randint(0, 4096, (tokens,), generator=g), rope_inv_freq(head_dim, 1e6))
    slots = torch.randperm(blocks * block_size, generator=g)[:tokens]
    k_cache = torch.zeros(kv_heads, blocks, block_size, head_dim, dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    q_ref = apply_rope(torch.nn.functional.rms_norm(qkv[:, :heads], (head_dim,), q_w, 1e-6), cos, sin)
    k_ref = apply_rope(
        torch.nn.functional.rms_norm(qkv[:, heads : heads + kv_heads], (head_dim,), k_w, 1e-6), cos, sin
    )
    write_kv(ref_k, ref_v, k_ref, qkv[:, heads + kv_heads :], slots)

    q, _, _ = kernels.rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads, False, (q_w, k_w, 1e-6))
    assert torch.allclose(q, q_ref, rtol=1e-5, atol=1e-5)
    ulp = 2**-7 if cache_dtype == torch.bfloat16 else 1e-5
    assert (k_cache.float() - ref_k.float()).abs().le(ref_k.float().abs() * ulp + 1e-5).all()
    assert torch.equal(v_cache, ref_v)
