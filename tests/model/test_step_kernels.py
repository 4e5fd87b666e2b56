"""The small kernels around a decode step's layers: RoPE's tables and the final norm over picked rows."""

import pytest
import torch

from sarathi.model import kernels

needs_avx2 = pytest.mark.skipif(not kernels.portable_available(), reason="kernels need a compiler and AVX2")


@needs_avx2
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_of_picked_rows_is_select_then_norm_then_round(out_dtype):
    """The final norm in one call: rows picked (any order, repeats), normalized and rounded, bit for bit
    what index_select, the float32 norm and .to(out_dtype) give; a row outside x is refused."""
    from sarathi.model.llama import RMSNorm

    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 100, generator=g) * 5
    norm = RMSNorm(100, 1e-5, out_dtype, "cpu")
    norm.weight.copy_(torch.randn(100, generator=g))
    rows = torch.tensor([8, 0, 3, 3])
    expected = kernels.rms_norm_f32(x.index_select(0, rows), norm.weight, 1e-5).to(out_dtype)
    assert torch.equal(norm.rows(x, rows), expected)
    assert torch.equal(norm(x), kernels.rms_norm_f32(x, norm.weight, 1e-5).to(out_dtype))
    reference = torch.nn.functional.rms_norm(x.index_select(0, rows), (100,), norm.weight, 1e-5)
    assert torch.allclose(
        norm.rows(x, rows).float(), reference, rtol=1e-2 if out_dtype == torch.bfloat16 else 1e-5
    )
    with pytest.raises(RuntimeError, match="outside x's 9 rows"):
        norm.rows(x, torch.tensor([9]))


@needs_avx2
@pytest.mark.parametrize("head_dim", [64, 80, 256])
def test_rope_tables_are_the_angles_cos_and_sin_correctly_rounded(head_dim):
    """One call for rope_cos_sin's tables: each value the float32 angle's cosine or sine computed in float64
    and rounded once (within an ulp of PyTorch's float32 ones), the same for a position whatever the batch."""
    from sarathi.model.rope import rope_cos_sin, rope_inv_freq

    g = torch.Generator().manual_seed(head_dim)
    inv_freq = rope_inv_freq(head_dim, 500000.0)
    positions = torch.randint(0, 131072, (37,), generator=g)
    cos, sin = rope_cos_sin(positions, inv_freq)
    angles = (positions.to(torch.float32)[:, None] * inv_freq[None, :]).double()
    exact_cos, exact_sin = angles.cos().float(), angles.sin().float()
    assert torch.equal(cos, torch.cat((exact_cos, exact_cos), -1).unsqueeze(1))
    assert torch.equal(sin, torch.cat((-exact_sin, exact_sin), -1).unsqueeze(1))
    torch_angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    assert torch.allclose(cos[:, 0, : head_dim // 2], torch_angles.cos(), rtol=0, atol=2**-23)
    for t in (0, 17, 36):
        one_cos, one_sin = rope_cos_sin(positions[t : t + 1], inv_freq)
        assert torch.equal(one_cos[0], cos[t]) and torch.equal(one_sin[0], sin[t])
