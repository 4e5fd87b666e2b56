"""Linear layer with the fastest CPU kernel for its weight storage and compute dtypes.

- bf16 weights with bf16 compute: our AVX512-BF16 kernel (`bf16_gemm`), bf16 inputs with float32
  accumulation and a float32 output, where it builds and the CPU has the instructions. It is as fast as
  oneDNN's bf16 GEMM from 32 rows up and 1.3-1.8x faster for one row, and it skips the bf16 rounding of the
  output that PyTorch's bf16 matmuls add. Elsewhere oneDNN's pre-packed bf16 GEMM (bf16 output).
- Weights stored in the compute dtype (fp32/fp32, bf16/bf16): pre-packed for oneDNN. On the target CPU the
  default fp32 `F.linear` (MKL) is 2-4x slower than oneDNN with a pre-packed weight for 1-64 rows, and bf16
  is ~2x slower for <= 8 rows; packing also helps at larger batches.
- bf16 weights with fp32 compute: PyTorch has no CPU kernel for that pair, but FBGEMM has an fp32 GEMM that
  reads fp16 weights. fp16 holds every bf16 value exactly once the layer is scaled by a power of two into
  fp16's range (bf16 has fewer significand bits), so this kernel computes exactly x @ W_bf16^T in fp32,
  at fp32 GEMM speed with half the weight bytes (faster than fp32 for one row: decode is bandwidth-bound).
  FBGEMM pads the input dimension to a multiple of 512 (a 576-wide layer is stored 1024 wide).
- GGUF-quantized weights (`load_quantized`): our quantized kernel over the file's blocks, in row segments
  (a fused layer may join parts of different formats), bf16 inputs, float32 sums and output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sarathi.model import kernels, quantized

# Largest |weight| the fp16 container is scaled to: a power of two below fp16's max (65504), high enough that
# the layer's weights sit far above fp16's subnormal range (< 6.1e-5), which would drop bf16 bits.
_FP16_CONTAINER_MAX_EXP = 15
_FP16_EXACT = (torch.bfloat16, torch.float16)  # weight dtypes an fp16 container holds exactly (when scaled)


def onednn_packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether pre-packed oneDNN linear ops can serve weights of this dtype on this device."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(ops._is_mkldnn_bf16_supported())


def fp16_weight_gemm_available(device: torch.device) -> bool:
    """Whether FBGEMM's fp32 GEMM over fp16-packed weights can run here (x86 CPUs with AVX2 or better)."""
    return (
        device.type == "cpu"
        and "fbgemm" in torch.backends.quantized.supported_engines
        and hasattr(torch.ops.quantized, "linear_prepack_fp16")
        and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    )


def _bf16_kernel_serves(w: torch.Tensor) -> bool:
    return w.device.type == "cpu" and w.shape[1] % 2 == 0 and kernels.available()


class Linear(nn.Module):
    """y = x W^T (+ b), weight stored in `dtype`, computed in `compute_dtype` (default: `dtype`).

    Call `pack()` once the weight is loaded to switch to the fast kernel for the pair of dtypes. The output is
    in the compute dtype, except with the bf16 kernel, whose output is float32 (`output_dtype`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = dtype if compute_dtype is None else compute_dtype
        self.weight: nn.Parameter | None = nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype, device=device), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
            if bias
            else None
        )
        self._packed: torch.Tensor | None = None  # oneDNN blocked weight
        self._bf16_packed: torch.Tensor | None = None  # bf16_gemm's layout
        self._fp16_packed: object | None = None  # FBGEMM fp16 container (weight / scale, bias / scale)
        self._fp16_scale = 1.0
        self._quant: list[tuple[int, quantized.PackedQuant]] = []  # (first output row, weight) segments
        self._formats: list[str] = []

    @property
    def is_packed(self) -> bool:
        """True once the weight lives only in a kernel's packed layout."""
        packed = self._packed is not None or self._fp16_packed is not None or self._bf16_packed is not None
        return packed or bool(self._quant)

    @property
    def output_dtype(self) -> torch.dtype:
        """What `forward` returns: float32 from the bf16 and quantized kernels, else the compute dtype."""
        return torch.float32 if self._bf16_packed is not None or self._quant else self.compute_dtype

    @property
    def quantized_formats(self) -> list[str]:
        """The GGUF formats of the quantized segments (empty for a plain weight)."""
        return sorted(set(self._formats))

    @property
    def quantized_segments(self) -> list[tuple[int, quantized.PackedQuant]]:
        """(first output row, weight) of each quantized segment (empty for a plain weight)."""
        return list(self._quant)

    @property
    def quantized_weight(self) -> quantized.PackedQuant | None:
        """The quantized weight when it is one segment of one format (what a tied embedding can share)."""
        return self._quant[0][1] if len(self._quant) == 1 else None

    @property
    def weight_bytes(self) -> int:
        """Resident bytes of the weight as this layer holds it."""
        if self._quant:
            return sum(p.nbytes for _, p in self._quant)
        for t in (self._bf16_packed, self._packed, self.weight):
            if t is not None:
                return t.numel() * t.element_size()
        return 0

    def load_quantized(self, parts: list[quantized.QuantizedTensor]) -> None:
        """Keep the weight as these quantized row blocks (stacked in order), never dequantized; needs our
        kernels. Consecutive parts of one format share a kernel call."""
        if not kernels.portable_available():
            raise RuntimeError("quantized weights need sarathi's CPU kernels, which are unavailable here")
        merged: list[quantized.QuantizedTensor] = []
        for part in parts:
            if part.cols != self.in_features:
                raise ValueError(f"quantized part has {part.cols} columns, the layer {self.in_features}")
            if merged and merged[-1].qtype == part.qtype:
                last = merged.pop()
                part = quantized.QuantizedTensor(
                    part.qtype, last.rows + part.rows, part.cols, torch.cat([last.blocks, part.blocks])
                )
            merged.append(part)
        rows = sum(p.rows for p in merged)
        if rows != self.out_features:
            raise ValueError(f"quantized parts have {rows} rows, the layer {self.out_features} outputs")
        row, self._quant, self._formats = 0, [], [p.qtype for p in merged]
        for part in merged:
            self._quant.append((row, quantized.pack(quantized.unpack(part))))
            row += part.rows
        self.weight = None
        if self.bias is not None:
            self.bias = nn.Parameter(self.bias.detach().float(), requires_grad=False)

    def pack(self) -> bool:
        """Move the weight into the fast kernel's layout and drop the plain copy; False (no-op) where no
        such kernel exists here."""
        w = self.weight
        if self._quant:
            return True
        if w is None:
            return False
        if w.dtype == self.compute_dtype == torch.bfloat16 and _bf16_kernel_serves(w):
            self._bf16_packed = kernels.pack(w.detach())
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias.detach().float(), requires_grad=False)
        elif w.dtype == self.compute_dtype:
            if not onednn_packing_available(w.dtype, w.device):
                return False
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach())
        elif w.dtype in _FP16_EXACT and self.compute_dtype == torch.float32:
            if not fp16_weight_gemm_available(w.device):
                return False
            self._pack_fp16_container(w.detach())
        else:
            return False
        self.weight = None  # the plain copy would double the memory; the packed one is all we use
        return True

    def _pack_fp16_container(self, w: torch.Tensor) -> None:
        largest = w.abs().max().item()
        exp = 0 if largest == 0 else math.frexp(largest)[1] - _FP16_CONTAINER_MAX_EXP
        self._fp16_scale = 2.0**exp  # a power of two: dividing by it and multiplying back are exact
        bias = None if self.bias is None else self.bias.detach().float() / self._fp16_scale
        self._fp16_packed = torch.ops.quantized.linear_prepack_fp16(w.float() / self._fp16_scale, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer to x [..., in_features] (in the compute dtype)."""
        if self._quant:  # the kernel reads bf16 or float32 x as it is (a decode step makes ~120 calls)
            x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
            if len(self._quant) == 1:
                y = kernels.quant_linear(x2, self._quant[0][1])
            else:
                y = torch.empty(x2.shape[0], self.out_features, dtype=torch.float32, device=x.device)
                for row, w in self._quant:
                    kernels.quant_gemm(x2, w, y[:, row : row + w.rows])
            if self.bias is not None:
                y += self.bias
            return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)
        if self._bf16_packed is not None:
            return kernels.gemm(x, self._bf16_packed, self.out_features, self.bias)
        if self._packed is not None:
            if x.dtype != self.compute_dtype:  # e.g. float32 attention output into a bf16 layer
                x = x.to(self.compute_dtype)
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        if self._fp16_packed is not None:
            y = torch.ops.quantized.linear_dynamic_fp16(x, self._fp16_packed)
            return y if self._fp16_scale == 1.0 else y.mul_(self._fp16_scale)
        if self.weight.dtype != x.dtype:  # no kernel for the dtype pair here: upcast per call (slow)
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self.weight.to(x.dtype), bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, compute_dtype={self.compute_dtype}, packed={self.is_packed}"
            + (f", quantized={'+'.join(self._formats)}" if self._quant else "")
        )
