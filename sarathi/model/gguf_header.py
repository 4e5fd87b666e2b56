"""A GGUF file's header read fast: its metadata (scalars, and arrays up to a few dozen items; longer ones, the
tokenizer's vocabulary and merges, by length only) and its tensors as views of a memory map.

`gguf.GGUFReader` builds a numpy view per item of every array, ~2.5 s for a small model's tokenizer; the
engine's workers only need the architecture keys and the tensors, so they read the header with this (tens of
milliseconds). The tokenizer is extracted once, with `gguf.GGUFReader`, into a cached folder.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
SMALL_ARRAY = 64  # arrays up to this many items are kept whole
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class LongArray:
    """A metadata array too long to keep: its length."""

    length: int


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: `shape` in GGML order (fastest dimension first), `data` as `gguf.GGUFReader` gives it (the
    typed values for plain types, else bytes with the last dimension in bytes per row)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    data: np.ndarray

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        s = bytes(self.buf[self.at : self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return s

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            self.at += 8 + struct.unpack_from("<Q", self.buf, self.at)[0]

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            if kind not in _SCALARS:
                raise ValueError(f"unknown GGUF value type {kind}")
            return self.scalar(_SCALARS[kind])
        item, count = self.scalar("<I"), self.scalar("<Q")
        if count <= SMALL_ARRAY:
            return [self.value(item) for _ in range(count)]
        if item == _STRING:
            self.skip_strings(count)
        elif item in _SCALARS:
            self.at += count * struct.calcsize(_SCALARS[item])
        else:  # arrays of arrays: walk them
            for _ in range(count):
                self.value(item)
        return LongArray(count)


class GGUFHeader:
    """`metadata` (key -> value) and `tensors` (in file order) of a GGUF file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._map = np.memmap(self.path, mode="r")
        cur = _Cursor(memoryview(self._map))
        if bytes(cur.buf[:4]) != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (no GGUF magic)")
        cur.at = 4
        version = cur.scalar("<I")
        if version < 2:
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (2 or later)")
        num_tensors, num_kv = cur.scalar("<Q"), cur.scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))
        infos = []
        for _ in range(num_tensors):
            name = cur.string()
            dims = tuple(cur.scalar("<Q") for _ in range(cur.scalar("<I")))
            infos.append((name, dims, GGMLQuantizationType(cur.scalar("<I")), cur.scalar("<Q")))
        alignment = int(self.metadata.get("general.alignment", 32))
        start = -(-cur.at // alignment) * alignment
        self.tensors = [self._tensor(name, dims, kind, start + offset) for name, dims, kind, offset in infos]

    def _tensor(self, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType, at: int) -> GGUFTensor:
        np_dims = tuple(reversed(dims))
        count = int(np.prod(dims)) if dims else 1
        if kind in _PLAIN_DTYPES:
            dtype = np.dtype(_PLAIN_DTYPES[kind])
            data = self._map[at : at + count * dtype.itemsize].view(dtype).reshape(np_dims)
        else:
            block, size = GGML_QUANT_SIZES[kind]
            n_bytes = count // block * size
            data = self._map[at : at + n_bytes].reshape(quant_shape_to_byte_shape(np_dims, kind))
        return GGUFTensor(name, dims, kind, data)
