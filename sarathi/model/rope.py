"""Rotary position embeddings (half-split layout, as in Hugging Face Llama checkpoints)."""

from __future__ import annotations

import math

import torch

from sarathi.model import kernels
from sarathi.model.config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/head_dim) for i < head_dim/2, float32, with optional scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise ValueError(f"unsupported rope scaling type {scaling.rope_type!r}")


def _llama3_scaled(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama-3.1 scaling: slow all low frequencies by `factor`, keep high ones, blend linearly in between.

    Bands are defined by wavelength relative to the original context: wavelengths longer than
    original/low_freq_factor are scaled, shorter than original/high_freq_factor kept.
    """
    original = s.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = inv_freq / s.factor
    # Weight of the unscaled frequency: 0 at the low-frequency edge, 1 at the high-frequency edge.
    smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    is_low = wavelen > original / s.low_freq_factor
    is_high = wavelen < original / s.high_freq_factor
    return torch.where(is_low, scaled, torch.where(is_high, inv_freq, blended))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rotation tables for `apply_rope`, float32 [T, 1, head_dim] (broadcast over heads).

    cos is (cos, cos) and sin is (-sin, sin) over the two halves, so that the rotation is
    x * cos + swap_halves(x) * sin. On CPU, our kernel makes both in one call where it runs, each value its
    float32 angle's cosine or sine correctly rounded (`kernels.rope_tables`); elsewhere PyTorch's float32
    cos and sin (within an ulp of those).
    """
    if positions.is_cpu and inv_freq.is_cpu and kernels.portable_available():
        return kernels.rope_tables(positions, inv_freq)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((-sin, sin), -1).unsqueeze(1)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Rotate x [T, heads, head_dim], pairing dims (i, i + head_dim/2); float32 math, result in `out_dtype`
    (default x.dtype)."""
    xf = x.float()
    swapped = torch.roll(xf, shifts=x.shape[-1] // 2, dims=-1)  # (x2, x1)
    return torch.addcmul(xf * cos, swapped, sin).to(x.dtype if out_dtype is None else out_dtype)
