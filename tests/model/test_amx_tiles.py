"""AMX tiles (Intel Xeon Sapphire Rapids on) against the AVX-512 register tiles: the same sums."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sarathi.model import kernels

needs_avx512 = pytest.mark.skipif(not kernels.available(), reason="kernels need a compiler and AVX512-BF16")


@needs_avx512
def test_amx_tiles_and_the_register_tiles_give_the_same_sums(tmp_path):
    """SARATHI_AMX=0 turns AMX tiles off (`amx()` False): both ways sum the same bf16 products in float32,
    the bf16 GEMM and the quantized one's dequantized tiles, to float32 rounding (checked where the CPU has
    AMX tiles; elsewhere both runs take the register tiles)."""
    from sarathi.model import quantized

    w = torch.randn(100, 1536)
    x = torch.randn(37, 1536)
    q = quantized.pack(quantized.unpack(quantized.quantize(w, "Q8_0")))
    torch.save({"w": w, "x": x, "q": q}, tmp_path / "case.pt")
    code = (
        "import os, torch\n"
        "from sarathi.model import kernels\n"
        "assert kernels.amx() == (os.environ['SARATHI_AMX'] != '0' and kernels.amx())\n"
        f"case = torch.load({str(tmp_path / 'case.pt')!r}, weights_only=False)\n"
        "y = kernels.gemm(case['x'], kernels.pack(case['w'].bfloat16()), 100, None)\n"
        "out = torch.empty(37, 100)\n"
        "kernels.quant_gemm(case['x'], case['q'], out, int8_rows=0)\n"
        "torch.save((kernels.amx(), y, out), os.environ['OUT'])\n"
    )
    results = []
    for setting in ("1", "0"):
        # SARATHI_DEQUANT_ROWS=1: the dequantized-tile path on the register tiles too (from 96 rows otherwise)
        env = {**os.environ, "SARATHI_AMX": setting, "SARATHI_DEQUANT_ROWS": "1"}
        env["OUT"] = str(tmp_path / f"out{setting}.pt")
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        results.append(torch.load(tmp_path / f"out{setting}.pt"))
    (amx_on, y_on, q_on), (amx_off, y_off, q_off) = results
    assert amx_on == kernels.amx() and not amx_off
    for on, off in ((y_on, y_off), (q_on, q_off)):
        assert torch.allclose(on, off, rtol=1e-5, atol=1e-5 * off.abs().max().item())
