"""Slices of checkpoint tensors, so that a sharded rank reads only the part of each tensor it holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sarathi.model.quantized import QuantizedTensor


@dataclass(frozen=True)
class TensorPart:
    """Checkpoint tensor `name`, or only its indices [start, end) along `dim` (dim None: the whole tensor).

    `dim_size` is the tensor's full length along `dim`, checked on read: a checkpoint whose tensor is larger
    than the architecture says would otherwise be sliced silently.
    """

    name: str
    dim: int | None = None
    start: int = 0
    end: int = 0
    dim_size: int = 0

    @classmethod
    def of(cls, name: str, dim: int, start: int, end: int, dim_size: int) -> TensorPart:
        """The slice, or the whole tensor when the slice covers all of `dim`."""
        if (start, end) == (0, dim_size):
            return cls(name)
        return cls(name, dim, start, end, dim_size)

    def index(self) -> tuple[slice, ...]:
        """The indexing tuple selecting this part."""
        if self.dim is None:
            return ()
        return (slice(None),) * self.dim + (slice(self.start, self.end),)

    def check_shape(self, shape: Sequence[int]) -> None:
        """ValueError unless a tensor of the full `shape` can hold this part."""
        if self.dim is not None and (len(shape) <= self.dim or shape[self.dim] != self.dim_size):
            raise ValueError(
                f"tensor {self.name!r} has shape {tuple(shape)}, "
                f"expected {self.dim_size} along dim {self.dim}"
            )

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        """This part of the whole tensor (a view)."""
        self.check_shape(tensor.shape)
        return tensor if self.dim is None else tensor.narrow(self.dim, self.start, self.end - self.start)

    def __str__(self) -> str:
        if self.dim is None:
            return self.name
        return f"{self.name}[{', '.join([':'] * self.dim + [f'{self.start}:{self.end}'])}]"


# Loads a part of a checkpoint tensor; raises KeyError if the tensor is absent.
Fetch = Callable[[TensorPart], torch.Tensor]

# Loads a part of a checkpoint tensor as its file's quantized blocks; None where it cannot (then use Fetch).
QuantizedFetch = Callable[[TensorPart], "QuantizedTensor | None"]
