"""`TokenEmbedding`: the token table, as values or kept in a GGUF file's quantized blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sarathi.model import kernels
from sarathi.model.quantized import PackedQuant, QuantizedTensor, pack, unpack


class TokenEmbedding(nn.Module):
    """Rows of a [vocab, hidden] table, looked up as float32.

    The table is `weight` (values in `dtype`), or a quantized weight in our kernel's layout: a GGUF table
    loaded with `load_quantized`, or, for tied embeddings, the LM head's own quantized weight
    (`share_quantized`), so that the largest tensor of a small model is held once, in the file's bytes.
    Quantized rows are dequantized exactly (as the `gguf` package does, rounded once to float32).
    """

    def __init__(self, num_embeddings: int, dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight: nn.Parameter | None = nn.Parameter(
            torch.empty(num_embeddings, dim, dtype=dtype, device=device), requires_grad=False
        )
        self._quant: PackedQuant | None = None
        self._shared = False  # the quantized weight belongs to another module (a tied LM head)
        self.quantized_format: str | None = None

    def load_quantized(self, table: QuantizedTensor) -> None:
        """Keep the table as these blocks, never dequantized in memory (needs our kernels)."""
        if (table.rows, table.cols) != (self.num_embeddings, self.dim):
            raise ValueError(f"quantized table is {table.rows} x {table.cols}, expected {self._shape}")
        self.share_quantized(pack(unpack(table)), table.qtype)
        self._shared = False

    def share_quantized(self, packed: PackedQuant, qtype: str) -> None:
        """Read rows from `packed` (e.g. a tied LM head's weight) and drop the values."""
        if not kernels.portable_available():
            raise RuntimeError(
                "a quantized embedding needs sarathi's CPU kernels, which are unavailable here"
            )
        if (packed.rows, packed.cols) != (self.num_embeddings, self.dim):
            raise ValueError(f"quantized table is {packed.rows} x {packed.cols}, expected {self._shape}")
        self._quant, self.quantized_format, self.weight, self._shared = packed, qtype, None, True

    @property
    def _shape(self) -> str:
        return f"{self.num_embeddings} x {self.dim}"

    @property
    def weight_bytes(self) -> int:
        """Resident bytes of the table as this module holds it (0 when it shares the LM head's)."""
        if self.weight is not None:
            return self.weight.numel() * self.weight.element_size()
        return 0 if self._quant is None or self._shared else self._quant.nbytes

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [*ids.shape, dim]."""
        if self._quant is not None:
            if ids.dim() == 1:  # a forward's flattened tokens: no reshaping ops (~10 us each on cold caches)
                return kernels.quant_rows(ids, self._quant)
            return kernels.quant_rows(ids.reshape(-1), self._quant).view(*ids.shape, self.dim)
        return F.embedding(ids, self.weight).float()

    def extra_repr(self) -> str:
        kept = f", quantized={self.quantized_format}" if self._quant is not None else ""
        return f"{self.num_embeddings}, {self.dim}{kept}"
