"""GGUF-quantized weights kept in their blocks: unpacking equals the `gguf` package's dequantization, and the
quantized kernel equals x times those exact weights, at odd shapes, batch sizes 1 / 4 / 7 / 9 / 17 / 33 / 64:
up to the kernel's threshold for the code width on this CPU (`kernels.quant_int8_rows`: 4 to 256, or every
row count) x in two int8 terms per 32 positions (the VNNI path, or VPMADDUBSW on the AVX2 path), more rows x
rounded to bf16 (float32 on the AVX2 path), and each path forced at row counts this CPU sends to the other;
fused layers of mixed formats and TP slices on block boundaries."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch

from sarathi.model import kernels, quantized
from sarathi.model.linear import Linear

pytestmark = pytest.mark.skipif(
    not kernels.portable_available(), reason="sarathi's CPU kernels do not run here"
)

# Ranges for each format's float16 fields (d, and m / dmin where present) that keep weights ~N(0, 0.05)-sized.
_HALF_FIELDS = {
    "Q8_0": [(0, 1e-3, 2e-2)],
    "Q4_0": [(0, 1e-3, 2e-2)],
    "Q5_0": [(0, 1e-3, 2e-2)],
    "Q4_1": [(0, 1e-3, 2e-2), (2, -0.1, 0.1)],
    "Q5_1": [(0, 1e-3, 2e-2), (2, -0.1, 0.1)],
    "Q4_K": [(0, 1e-4, 1e-3), (2, 1e-4, 1e-3)],
    "Q5_K": [(0, 1e-4, 1e-3), (2, 1e-4, 1e-3)],
    "Q6_K": [(208, 1e-4, 1e-3)],
    "Q3_K": [(108, 1e-4, 1e-3)],
    "Q2_K": [(80, 1e-4, 1e-3), (82, 1e-4, 1e-3)],
    "IQ4_NL": [(0, 1e-4, 1e-3)],
    "IQ4_XS": [(0, 1e-5, 1e-4)],
}


def random_quantized(qtype: str, rows: int, cols: int, seed: int = 0) -> quantized.QuantizedTensor:
    """Random blocks of `qtype` (every code and sub-block scale bit pattern is valid; the float16 fields
    are drawn from sane ranges)."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(seed)
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    for offset, lo, hi in _HALF_FIELDS[qtype]:
        halves = rng.uniform(lo, hi, size=n).astype(np.float16)
        raw[:, offset : offset + 2] = halves.view(np.uint8).reshape(n, 2)
    return quantized.QuantizedTensor(qtype, rows, cols, torch.from_numpy(raw.reshape(rows, -1)))


def gguf_dequantized(t: quantized.QuantizedTensor) -> torch.Tensor:
    values = gguf.quants.dequantize(t.blocks.numpy(), gguf.GGMLQuantizationType[t.qtype])
    return torch.from_numpy(np.asarray(values, dtype=np.float32)).reshape(t.rows, t.cols)


def takes_int8_path(qtype: str, rows: int) -> bool:
    """Whether the kernel multiplies `rows` rows of x in two int8 terms in this process (the machine's
    measured threshold for the code width once a quantized model is loaded, else the kernel's table)."""
    return rows <= kernels.quant_int8_rows(quantized.FORMATS[qtype].code_kind)


def takes_dequantized_path(qtype: str, rows: int) -> bool:
    """Whether the many-rows path multiplies tiles dequantized to bf16 weights (from more rows for formats
    without offsets; never on the AVX2 build)."""
    return rows >= kernels.quant_dequant_rows(quantized.FORMATS[qtype].offsets)


def test_int8_row_thresholds() -> None:
    """The kernel's own table: 8-bit codes take the int8 path up to at least 32 rows on every CPU kind without
    AMX tiles, 8 or 16 rows of every width with them (the AMX path takes over from 8); the other widths at
    least up to 4 rows (one-sequence decode) and at most 256; every row count where the int8 path is AVX-512
    and the other the AVX2 build (the "vnni" and "avx512bw" levels). The threshold in force is the table's or
    the machine's measured one (tests/model/test_quant_path_tuning.py), at least 4 rows."""
    if kernels.level() in ("vnni", "avx512bw"):
        assert all(kernels.quant_int8_rows_builtin(bits) == 2**63 - 1 for bits in (4, 5, 6, 8))
    elif kernels.amx():
        assert [kernels.quant_int8_rows_builtin(bits) for bits in (4, 5, 6, 8)] == [16, 8, 8, 16]
        assert kernels.quant_dequant_rows_builtin(True) == kernels.quant_dequant_rows_builtin(False) == 8
    else:
        assert kernels.quant_int8_rows_builtin(8) in (32, 128, 256)
        for bits in (4, 5, 6):
            assert 4 <= kernels.quant_int8_rows_builtin(bits) <= 256
    for bits in (4, 5, 6, 8):
        assert kernels.quant_int8_rows(bits) >= 4
    # IQ4's table indices: a threshold of their own, built in on the AVX-512 build at most the 4-bit
    # codes' (both paths decode them so; a Zen5's int8 path falls behind sooner on the table's shuffle)
    # and as the 8-bit codes' on the AVX2 build (its int8 path multiplies them so); 2- and 3-bit codes
    # likewise at most the 4-bit codes' (more decoding per byte on the int8 path)
    assert kernels.quant_int8_rows(quantized.IQ4_CODES) >= 4
    if kernels.available():
        for kind in (quantized.IQ4_CODES, 3, 2):
            assert 4 <= kernels.quant_int8_rows_builtin(kind) <= kernels.quant_int8_rows_builtin(4)
    else:
        assert kernels.quant_int8_rows_builtin(quantized.IQ4_CODES) == kernels.quant_int8_rows_builtin(8)
    for op in (kernels.quant_int8_rows, kernels.quant_int8_rows_builtin):
        with pytest.raises(RuntimeError, match="unsupported code width"):
            op(7)


def reference_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (rounded to bf16 on the AVX-512 path; float32 on the AVX2 path) times w, in float64."""
    return (x.bfloat16() if kernels.available() else x).double() @ w.double().T


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the VNNI path multiplies it: per 32 positions, t = x * 127 / max|x| (float32), q1 = round(t),
    q2 = round((t - q1) * 256) (to nearest even) held to +-127, and x ~ (q1 + q2 / 256) * max|x| / 127."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    # 127 / max|x| divided in float32 as the kernel does (a Python number over a tensor is a reciprocal times)
    t = blocks * torch.where(amax > 0, torch.full_like(amax, 127) / amax, torch.zeros_like(amax))
    q1 = torch.round(t)
    q2 = torch.round((t - q1) * 256).clamp(-127, 127)
    return ((q1.double() * 256 + q2.double()) * (amax.double() / (127 * 256))).reshape(x.shape)


def reference_vnni(x: torch.Tensor, u: quantized.Unpacked) -> torch.Tensor:
    """The VNNI path's product in float64: the scaled codes s * (q - z) against the int8 x, and the offsets m
    against the exact x (their sums are taken from x itself)."""
    scaled = quantized.dequantize(dataclasses.replace(u, dm=None)).double()
    offsets = quantized.dequantize(u).double() - scaled
    return int8_activations(x).double() @ scaled.T + x.double() @ offsets.T


def shape_for(qtype: str) -> tuple[int, int]:
    """Odd row count; columns of 3 blocks (k-quants: 2 super-blocks), not a multiple of the 8-group chunk."""
    block = quantized.FORMATS[qtype].block
    return 37, (2 * block if block == 256 else 3 * block + 32 * 8)


@pytest.mark.parametrize("qtype", list(quantized.FORMATS))
def test_unpacked_weights_equal_gguf_dequantization(qtype: str) -> None:
    rows, cols = shape_for(qtype)
    t = random_quantized(qtype, rows, cols)
    ours = quantized.dequantize(quantized.unpack(t))
    ref = gguf_dequantized(t)
    # gguf rounds k-quants' "d * q - dmin * m" in float32; ours is exact before the final rounding
    tol = 1e-6 * ref.abs().max().item() if quantized.FORMATS[qtype].sub_scales else 0.0
    assert (ours - ref).abs().max().item() <= tol


@pytest.mark.parametrize("batch", [1, 4, 7, 9, 17, 33, 64])
@pytest.mark.parametrize("qtype", list(quantized.FORMATS))
def test_quantized_kernel_multiplies_the_exact_weights(qtype: str, batch: int) -> None:
    rows, cols = shape_for(qtype)
    t = random_quantized(qtype, rows, cols, seed=batch)
    u = quantized.unpack(t)
    x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(batch))
    x[0, :32] = 0.0  # an all-zero block of x (scale 0)
    out = torch.full((batch, rows), float("nan"))
    kernels.quant_gemm(x, quantized.pack(u), out)
    if takes_int8_path(qtype, batch):
        want = reference_vnni(x, u)
    elif takes_dequantized_path(qtype, batch):  # bf16 x against the weights rounded to bf16
        want = reference_matmul(x, quantized.dequantize(u).float().bfloat16())
    else:
        want = reference_matmul(x, quantized.dequantize(u))
    err = ((out.double() - want).abs().max() / want.abs().max()).item()
    assert err <= 2e-6, f"{qtype} batch {batch}: relative error {err:.2e}"


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_one_row_of_a_long_weight(qtype: str) -> None:
    """One row of x against a long weight (the int8 path then reads one tile at a time, in one stream; three
    rows of x read two tiles at a time): the exact weights, and the same values as that row among three."""
    rows, cols = 4096 + 17, 2048
    u = quantized.unpack(random_quantized(qtype, rows, cols, seed=3))
    w = quantized.pack(u)
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(3))
    one, three = torch.full((1, rows), float("nan")), torch.full((3, rows), float("nan"))
    kernels.quant_gemm(x[:1], w, one, int8_rows=3)
    kernels.quant_gemm(x, w, three, int8_rows=3)
    want = reference_vnni(x[:1], u)
    assert ((one.double() - want).abs().max() / want.abs().max()).item() <= 2e-6
    assert torch.equal(one[0], three[0])


@pytest.mark.parametrize("batch", [9, 33, 65, 300])
@pytest.mark.parametrize("path", ["int8", "dense"])
@pytest.mark.parametrize("qtype", list(quantized.FORMATS))
def test_either_path_at_any_row_count(qtype: str, path: str, batch: int) -> None:
    """Each path forced past this CPU's threshold: both are checked at row counts the CPU sends elsewhere
    (300 rows: the int8 path's second slab of x)."""
    rows, cols = shape_for(qtype)
    u = quantized.unpack(random_quantized(qtype, rows, cols, seed=batch))
    x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(batch))
    out = torch.full((batch, rows), float("nan"))
    kernels.quant_gemm(x, quantized.pack(u), out, int8_rows=batch if path == "int8" else 0)
    if path == "int8":
        want = reference_vnni(x, u)
    elif takes_dequantized_path(qtype, batch):
        want = reference_matmul(x, quantized.dequantize(u).float().bfloat16())
    else:
        want = reference_matmul(x, quantized.dequantize(u))
    err = ((out.double() - want).abs().max() / want.abs().max()).item()
    assert err <= 2e-6, f"{qtype} {path} path, batch {batch}: relative error {err:.2e}"


@pytest.mark.skipif(not kernels.available(), reason="needs AVX-512 with BF16 and VNNI")
@pytest.mark.parametrize("setting", ["vnni", "avx512bw"])
def test_a_cpu_with_avx512_but_no_bf16_runs_the_int8_path_at_every_row_count(setting, tmp_path) -> None:
    """SARATHI_KERNELS=vnni (as on an Intel Cascade Lake or Ice Lake) or avx512bw (as on a Skylake-SP, without
    VNNI: VPMADDUBSW and VPMADDWD): a fresh process runs the AVX2 builds but multiplies quantized weights on
    AVX-512 at any row count, bit for bit as this process's int8 path (1 row: one tile at a time; 9: two side
    by side, 4-row register tiles and a 1-row one; 300: a second slab of x)."""
    cases = {}
    for i, qtype in enumerate(quantized.FORMATS):
        rows, cols = shape_for(qtype)
        w = quantized.pack(quantized.unpack(random_quantized(qtype, rows, cols, seed=i)))
        for batch in (1, 2, 9, 300):
            x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(batch + i))
            want = torch.empty(batch, rows)
            kernels.quant_gemm(x, w, want, int8_rows=batch)
            cases[f"{qtype}-{batch}"] = (x, w, want)
    torch.save(cases, tmp_path / "cases.pt")
    code = (
        "import torch\n"
        "from sarathi.model import kernels\n"
        f"assert kernels.level() == {setting!r}\n"
        f"assert kernels.status() == '{setting} (SARATHI_KERNELS={setting})'\n"
        "assert kernels.quant_int8_rows(4) == kernels.quant_int8_rows(6) == 2**63 - 1\n"
        f"cases = torch.load({str(tmp_path / 'cases.pt')!r}, weights_only=False)\n"
        "for name, (x, w, want) in cases.items():\n"
        "    out = torch.full_like(want, float('nan'))\n"
        "    kernels.quant_gemm(x, w, out)\n"
        "    assert torch.equal(out, want), name\n"
        "print('ok')\n"
    )
    env = {**os.environ, "SARATHI_KERNELS": setting}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    isa = "AVX-512 VNNI" if setting == "vnni" else "AVX-512)"
    assert f"int8 products on {isa}" in done.stderr


def test_int8_rows_must_be_a_row_count_or_minus_one() -> None:
    w = quantized.pack(quantized.unpack(random_quantized("Q8_0", 16, 64)))
    with pytest.raises(RuntimeError, match="int8_rows"):
        kernels.quant_gemm(torch.randn(2, 64), w, torch.empty(2, 16), int8_rows=-2)


def merge(parts: list[quantized.QuantizedTensor]) -> quantized.QuantizedTensor:
    """Row blocks of one format stacked into one tensor."""
    blocks = torch.cat([p.blocks for p in parts])
    return quantized.QuantizedTensor(parts[0].qtype, sum(p.rows for p in parts), parts[0].cols, blocks)


def test_fused_layer_of_mixed_formats_and_its_bias() -> None:
    """Gemma's files put q and k in Q5_0 and v in Q8_0: one layer, three segments, two kernel calls."""
    cols = 96
    parts = [random_quantized("Q5_0", 20, cols, 1), random_quantized("Q5_0", 8, cols, 2)]
    parts.append(random_quantized("Q8_0", 8, cols, 3))
    layer = Linear(cols, 36, True, torch.bfloat16, compute_dtype=torch.bfloat16)
    layer.bias.copy_(torch.linspace(-1, 1, 36))
    layer.load_quantized(parts)
    assert layer.is_packed and layer.weight is None and layer.quantized_formats == ["Q5_0", "Q8_0"]
    assert len(layer._quant) == 2
    x = torch.randn(5, 3, cols)
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (5, 3, 36)
    x2 = x.reshape(-1, cols)  # 15 rows: on AVX-512 Q5_0 on the bf16 path, Q8_0 on the int8 path

    def reference(segment: list[quantized.QuantizedTensor]) -> torch.Tensor:
        if takes_int8_path(segment[0].qtype, 15):  # the layer passes x on as it is (float32)
            return reference_vnni(x2, quantized.unpack(merge(segment)))
        weights = torch.cat([gguf_dequantized(p) for p in segment])
        if takes_dequantized_path(segment[0].qtype, 15):  # AMX tiles: from 8 rows
            weights = weights.float().bfloat16()
        return reference_matmul(x2, weights)

    want = torch.cat([reference(parts[:2]), reference(parts[2:])], dim=1)
    want = want + layer.bias.double()
    assert torch.allclose(y.reshape(-1, 36).double(), want, rtol=0, atol=1e-5)


def test_slices_on_block_boundaries_and_not_inside_blocks() -> None:
    t = random_quantized("Q4_K", 12, 768)
    w = gguf_dequantized(t)
    assert torch.equal(gguf_dequantized(t.col_slice(256, 768)), w[:, 256:768])
    assert torch.equal(gguf_dequantized(t.row_slice(3, 9)), w[3:9])
    assert t.col_slice(0, 384) is None  # cuts a 256-weight super-block: the loader dequantizes instead
    order = torch.tensor([5, 0, 11, 1, 2, 3, 4, 6, 7, 8, 9, 10])
    assert torch.equal(gguf_dequantized(t.permute_rows(order)), w[order])


def test_layer_rejects_parts_of_the_wrong_shape() -> None:
    layer = Linear(64, 16, False, torch.bfloat16, compute_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="columns"):
        layer.load_quantized([random_quantized("Q8_0", 16, 96)])
    with pytest.raises(ValueError, match="rows"):
        layer.load_quantized([random_quantized("Q8_0", 8, 64)])


@pytest.mark.parametrize("qtype", list(quantized.FORMATS))
def test_rows_of_a_quantized_table_equal_gguf_dequantization(qtype: str) -> None:
    """The token lookup of a quantized table: every row of a tile (0, 15, 16 start and end tiles, 36 in the
    partial last one), repeated ids, exactly the gguf package's values (k-quants: to its float32 rounding)."""
    rows, cols = shape_for(qtype)
    t = random_quantized(qtype, rows, cols, seed=11)
    ids = torch.tensor([0, 15, 16, 36, 5, 5, 31, 32])
    got = kernels.quant_rows(ids, quantized.pack(quantized.unpack(t)))
    exact = quantized.dequantize(quantized.unpack(t))[ids]
    assert torch.equal(got, exact)
    ref = gguf_dequantized(t)[ids]
    tol = 1e-6 * ref.abs().max().item() if quantized.FORMATS[qtype].sub_scales else 0.0
    assert (got - ref).abs().max().item() <= tol


def test_quantized_table_lookup_rejects_ids_outside_the_vocabulary() -> None:
    from sarathi.model.embedding import TokenEmbedding

    table = TokenEmbedding(37, 96, torch.bfloat16, "cpu")
    table.load_quantized(random_quantized("Q8_0", 37, 96))
    assert (
        table.weight is None
        and table.weight_bytes == quantized.pack(quantized.unpack(random_quantized("Q8_0", 37, 96))).nbytes
    )
    assert table(torch.tensor([[1, 2], [3, 36]])).shape == (2, 2, 96)
    with pytest.raises(RuntimeError, match="outside"):
        table(torch.tensor([37]))
    with pytest.raises(ValueError, match="expected 37 x 96"):
        table.load_quantized(random_quantized("Q8_0", 36, 96))
