"""GGUF-quantized weights kept in their file's bytes: the blocks of a tensor, their codes and scales, and the
layout our quantized GEMM kernel (`csrc/quant_gemm.cpp`) reads.

Every supported format is "w = s * (q - z) + m" per sub-block of 16 or 32 weights of a row: integer codes q,
a float16 scale d (per block, or per 256-weight super-block with a small integer multiplier sc per sub-block
for k-quants) and, for the formats with offsets, m = dm (* mc). `unpack` splits a tensor's blocks into those
parts; `pack` lays them out for the kernel. Both are lossless: `dequantize(unpack(...))` equals the `gguf`
package's dequantization (to float32 rounding of k-quant offsets, which we keep exact).

IQ4_NL and IQ4_XS store 4-bit indices into a table of 16 int8 values (IQ4_XS with a signed 6-bit multiplier
per 32 on a super-block scale). They keep the 4-bit layout of their indices; the kernels look the values up
where they read them (code kind `IQ4_CODES`), so they are held in the file's bytes.

Q3_K (codes -4..3, held as q + 4 in 3 bits, a signed 6-bit multiplier per 16 weights) and Q2_K (codes 0..3,
4-bit multipliers of a scale and of an offset per 16) keep their code widths, with sub-blocks of 16; their
multipliers are held as bytes, so their weights take `WIDENED[type][1]` times the file's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
import torch

from sarathi.model import huge_pages

GROUP = 32  # input positions per code group of the kernel layout
TILE = 16  # output columns per kernel tile
IQ4_CODES = 40  # the kernels' code kind for 4-bit indices into IQ4_TABLE (csrc/quant_layout.h: kIq4Codes)
IQ4_TABLE = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.int8)


@dataclass(frozen=True)
class QuantFormat:
    """How one GGUF type stores its weights (see the module docstring)."""

    name: str
    bits: int  # code width in the kernel's layout
    sub: int  # weights per sub-block (one scale)
    zero: int  # z: code value of weight 0 (signed 8-bit codes are stored as q - z already)
    sub_scales: bool  # k-quants: an integer multiplier per sub-block on a per-super-block scale
    offsets: bool  # m term present
    block: int  # weights per file block (a super-block for k-quants)
    table: bool = False  # codes are indices into IQ4_TABLE

    @property
    def code_kind(self) -> int:
        """The kernels' name for these codes: the width, or IQ4_CODES for table indices."""
        return IQ4_CODES if self.table else self.bits


FORMATS: dict[str, QuantFormat] = {
    f.name: f
    for f in (
        QuantFormat("Q8_0", 8, 32, 0, False, False, 32),
        QuantFormat("Q4_0", 4, 32, 8, False, False, 32),
        QuantFormat("Q4_1", 4, 32, 0, False, True, 32),
        QuantFormat("Q5_0", 5, 32, 16, False, False, 32),
        QuantFormat("Q5_1", 5, 32, 0, False, True, 32),
        QuantFormat("Q4_K", 4, 32, 0, True, True, 256),
        QuantFormat("Q5_K", 5, 32, 0, True, True, 256),
        QuantFormat("Q6_K", 6, 16, 32, True, False, 256),
        QuantFormat("Q3_K", 3, 16, 4, True, False, 256),
        QuantFormat("Q2_K", 2, 16, 0, True, True, 256),
        QuantFormat("IQ4_NL", 4, 32, 0, False, False, 32, table=True),
        QuantFormat("IQ4_XS", 4, 32, 0, True, False, 256, table=True),
    )
}

# the types held in more than the file's bytes: their layout, and the served bytes over the file's (per 256
# weights: Q3_K 110 bytes against 114 with its 6-bit multipliers as bytes, Q2_K 84 against 100 with its 4-bit
# ones as bytes)
WIDENED: dict[str, tuple[str, float]] = {
    "Q3_K": ("3-bit", (96 + 16 + 2) / 110),
    "Q2_K": ("2-bit", (64 + 16 + 16 + 2 + 2) / 84),
}


@dataclass(frozen=True)
class QuantizedTensor:
    """A 2-D weight [rows, cols] as the GGUF file stores it: `blocks` uint8 [rows, bytes per row]."""

    qtype: str
    rows: int
    cols: int
    blocks: torch.Tensor

    @property
    def format(self) -> QuantFormat:
        """The storage format."""
        return FORMATS[self.qtype]

    def row_slice(self, start: int, end: int) -> QuantizedTensor:
        """Rows [start, end)."""
        return QuantizedTensor(self.qtype, end - start, self.cols, self.blocks[start:end])

    def col_slice(self, start: int, end: int) -> QuantizedTensor | None:
        """Columns [start, end), or None where the cut falls inside a block."""
        block = self.format.block
        if start % block or end % block:
            return None
        per_block = self.blocks.shape[1] // (self.cols // block)
        first, last = start // block * per_block, end // block * per_block
        return QuantizedTensor(self.qtype, self.rows, end - start, self.blocks[:, first:last])

    def permute_rows(self, order: torch.Tensor) -> QuantizedTensor:
        """Rows reordered (blocks never span rows, so this moves whole rows)."""
        return QuantizedTensor(self.qtype, self.rows, self.cols, self.blocks[order])

    @property
    def nbytes(self) -> int:
        """Bytes of the file's blocks."""
        return self.blocks.numel()


# --quantization int8 / int4: the GGUF format an HF checkpoint's linear layers are quantized to at load
LOAD_TIME_FORMATS = {"int8": "Q8_0", "int4": "Q4_1"}


def quantize(weight: torch.Tensor, qtype: str) -> QuantizedTensor | None:
    """`weight` [rows, cols] quantized to `qtype` blocks (ggml's rounding, via the `gguf` package); None
    when the columns do not fill whole blocks."""
    rows, cols = weight.shape
    if cols % FORMATS[qtype].block:
        return None
    blocks = gguf.quants.quantize(weight.float().numpy(), gguf.GGMLQuantizationType[qtype])
    return QuantizedTensor(qtype, rows, cols, torch.from_numpy(np.ascontiguousarray(blocks)))


@dataclass(frozen=True)
class Unpacked:
    """A quantized tensor split into codes and scales (numpy, row-major per weight row)."""

    fmt: QuantFormat
    codes: np.ndarray  # uint8 [rows, cols] codes q (IQ4: table indices); int8 q - z for 8-bit formats
    d: np.ndarray  # float16 [rows, blocks]
    dm: np.ndarray | None  # float16 [rows, blocks]: offset scale (negated for k-quants' "- dmin * m")
    sc: np.ndarray | None  # int8 [rows, sub-blocks]
    mc: np.ndarray | None  # uint8 [rows, sub-blocks]


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """[n, c * width] bytes -> [n, c * 2 * width] codes: each run of `width` bytes gives its low nibbles,
    then its high nibbles (GGML's order)."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, width) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n, -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """[n, 4] bytes as a little-endian uint32 -> bit i of it for i < count: [n, count]."""
    words = qh.copy().view(np.uint32).reshape(-1, 1)
    return ((words >> np.arange(count, dtype=np.uint32).reshape(1, -1)) & 1).astype(np.uint8)


def _two_bit_codes(qs: np.ndarray) -> np.ndarray:
    """[n, 64] bytes -> [n, 256] 2-bit codes in GGML's order: weight 128h + 32s + i is bits 2s..2s+1 of byte
    32h + i."""
    n = qs.shape[0]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 256)


def _q3_k_codes(b: np.ndarray) -> np.ndarray:
    """Q3_K blocks' hmask (32 bytes) and qs (64) -> [n, 256] codes q + 4 for q = low 2 bits - 4 * (not the
    high bit): weight 128h + 32s + i takes its high bit from bit 4h + s of hmask byte i."""
    n = b.shape[0]
    high = (b[:, :32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    return _two_bit_codes(b[:, 32:96]) + 4 * high.reshape(n, 256)


def _q3_k_scales(b: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes -> [n, 16] signed multipliers: 6-bit values (low nibbles of bytes 0-7, then their
    high nibbles; two bits each from bytes 8-11) minus 32."""
    n = b.shape[0]
    low = (b[:, :8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)) & 0x0F
    high = (b[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)) & 3
    return (low.reshape(n, 16) | (high.reshape(n, 16) << 4)).astype(np.int8) - np.int8(32)


def _iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """IQ4_XS's scale bytes (a little-endian uint16 of high bit pairs, then 4 bytes of nibbles) -> [n, 8]
    signed multipliers: sub-block j's low four bits are nibble j % 2 of byte j // 2 of the second part, its
    two high bits bits 2j..2j+1 of the first; minus 32."""
    n = b.shape[0]
    low = (b[:, 2:6].reshape(n, 4, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)) & 0x0F
    words = b[:, :2].copy().view(np.uint16).reshape(n, 1)
    high = ((words >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)) & 3).astype(np.uint8)
    return (low.reshape(n, 8) | (high << 4)).astype(np.int8) - np.int8(32)


def unpack(t: QuantizedTensor) -> Unpacked:
    """Codes and scales of every block of `t`."""
    fmt = t.format
    raw = t.blocks.numpy()
    per_row = t.cols // fmt.block
    b = raw.reshape(t.rows * per_row, -1)
    n = b.shape[0]
    dm = sc = mc = None

    def half(lo: int) -> np.ndarray:
        return b[:, lo : lo + 2].copy().view(np.float16).reshape(n)

    if fmt.name == "Q8_0":
        d, codes = half(0), b[:, 2:].copy()
    elif fmt.name in ("Q4_0", "Q4_1"):
        start = 2 if fmt.name == "Q4_0" else 4
        d, codes = half(0), _nibbles(b[:, start:], 16)
        dm = half(2) if fmt.name == "Q4_1" else None
    elif fmt.name in ("Q5_0", "Q5_1"):
        start = 2 if fmt.name == "Q5_0" else 4
        d, codes = half(0), _nibbles(b[:, start + 4 :], 16) | (_high_bits(b[:, start : start + 4], 32) << 4)
        dm = half(2) if fmt.name == "Q5_1" else None
    elif fmt.name in ("Q4_K", "Q5_K"):
        d, dm = half(0), -half(2)
        sc6, m6 = gguf.quants.Q4_K.get_scale_min(b[:, 4:16].copy())
        sc, mc = sc6.astype(np.int8), m6.astype(np.uint8)
        if fmt.name == "Q4_K":
            codes = _nibbles(b[:, 16:], 32)
        else:
            qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            codes = _nibbles(b[:, 48:], 32) | ((qh & 1).reshape(n, 256) << 4)
    elif fmt.name == "Q6_K":
        ql = _nibbles(b[:, :128], 64)
        qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        codes = ql | ((qh & 3).reshape(n, 256) << 4)
        sc, d = b[:, 192:208].copy().view(np.int8), half(208)
    elif fmt.name == "Q3_K":
        codes, sc, d = _q3_k_codes(b[:, :96]), _q3_k_scales(b[:, 96:108]), half(108)
    elif fmt.name == "Q2_K":
        codes, d, dm = _two_bit_codes(b[:, 16:80]), half(80), -half(82)
        sc, mc = (b[:, :16] & 0x0F).astype(np.int8), b[:, :16] >> 4
    elif fmt.table:
        start = 2 if fmt.name == "IQ4_NL" else 8
        d, codes = half(0), _nibbles(b[:, start:], 16)
        if fmt.name == "IQ4_XS":
            sc = _iq4_xs_scales(b[:, 2:8])
    else:  # pragma: no cover - FORMATS lists what is handled here
        raise ValueError(f"no unpacking for {fmt.name}")
    rows = t.rows
    return Unpacked(
        fmt,
        codes.reshape(rows, t.cols),
        d.reshape(rows, per_row),
        None if dm is None else dm.reshape(rows, per_row),
        None if sc is None else sc.reshape(rows, -1),
        None if mc is None else mc.reshape(rows, -1),
    )


def dequantize(u: Unpacked) -> torch.Tensor:
    """The float32 weights [rows, cols] (float64 arithmetic, so exact before the final rounding)."""
    fmt = u.fmt
    rows, cols = u.codes.shape
    if fmt.table:
        signed = IQ4_TABLE[u.codes]
    else:
        signed = u.codes.view(np.int8) if fmt.bits == 8 else u.codes.astype(np.int16) - fmt.zero
    q = signed.astype(np.float64)
    subs_per_block = fmt.block // fmt.sub
    scale = np.repeat(u.d.astype(np.float64), subs_per_block, axis=1)
    shift = None if u.dm is None else np.repeat(u.dm.astype(np.float64), subs_per_block, axis=1)
    if u.sc is not None:
        scale = scale * u.sc
        if shift is not None:
            shift = shift * u.mc
    w = q.reshape(rows, -1, fmt.sub) * scale[..., None]
    if shift is not None:
        w = w + shift[..., None]
    return torch.from_numpy(w.reshape(rows, cols).astype(np.float32))


@dataclass(frozen=True)
class PackedQuant:
    """A quantized weight in the kernel's layout (see csrc/quant_gemm.cpp); `rows` is the output width."""

    rows: int
    cols: int
    bits: int  # the code kind (QuantFormat.code_kind)
    sub: int
    zero: int
    codes: torch.Tensor  # uint8 [tiles, cols / 32, group bytes]
    d: torch.Tensor  # float16 [tiles, blocks, 16]
    dm: torch.Tensor  # float16 [tiles, blocks, 16] or empty
    sc: torch.Tensor  # int8 [tiles, sub-blocks, 16] or empty
    mc: torch.Tensor  # uint8 [tiles, sub-blocks, 16] or empty

    @property
    def nbytes(self) -> int:
        """Resident bytes."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.d, self.dm, self.sc, self.mc))


def _tiled(a: np.ndarray, tiles: int) -> torch.Tensor:
    """[rows, n] per-row values -> [tiles, n, 16] (rows padded with zeros), on huge pages."""
    padded = np.zeros((tiles * TILE, a.shape[1]), dtype=a.dtype)
    padded[: a.shape[0]] = a
    return huge_pages.from_numpy(padded.reshape(tiles, TILE, -1).transpose(0, 2, 1))


def pack(u: Unpacked) -> PackedQuant:
    """The kernel's layout of an unpacked weight: per tile of 16 output columns and group of 32 input
    positions, eight "quads" of 64 bytes, byte 4c + i of quad r being the code of column c at position 4r + i
    (what VPDPBUSD multiplies against four int8 activations broadcast to every column)."""
    fmt = u.fmt
    rows, cols = u.codes.shape
    tiles = -(-rows // TILE)
    codes = np.zeros((tiles * TILE, cols), dtype=np.uint8)
    codes[:rows] = u.codes
    if fmt.bits == 8:
        codes ^= 0x80  # q - z + 128: unsigned, as VPDPBUSD's first operand must be
    # [tiles, 16 columns, groups, 8 quads, 4] -> [tiles, groups, quads, 4 * column + i]
    quads = codes.reshape(tiles, TILE, cols // GROUP, GROUP // 4, 4).transpose(0, 2, 3, 1, 4)
    quads = quads.reshape(tiles, cols // GROUP, GROUP // 4, 4 * TILE)
    groups = (tiles, cols // GROUP, -1)
    if fmt.bits == 8:
        parts = [quads.reshape(groups)]
    elif fmt.bits < 4:
        # rows 0-1: quads 4h .. 4h + 3's two low bits, quad 4h + j's at bits 2j, 2j + 1; then (3-bit codes) a
        # 64-byte plane whose bit r is bit 2 of quad r
        two = quads & 3
        rows2 = two[:, :, 0::4] | (two[:, :, 1::4] << 2) | (two[:, :, 2::4] << 4) | (two[:, :, 3::4] << 6)
        parts = [rows2.reshape(groups)]
        if fmt.bits == 3:
            plane = np.packbits((quads >> 2) & 1, axis=2, bitorder="little")
            parts.append(plane.reshape(groups))
    elif fmt.bits == 6:
        # rows 0-3: quad r's whole code, bits 4-5 of quad r + 4's in its top two bits; rows 4-5: the low
        # nibbles of quads 4 | 5 << 4 and 6 | 7 << 4. One instruction per quad for quads 0-3, three or four
        # for 4-7, where two bit planes took four for every quad.
        whole = (quads[:, :, :4] & 0x3F) | ((quads[:, :, 4:] >> 4) << 6)
        nibbles = (quads[:, :, 4:8:2] & 0x0F) | ((quads[:, :, 5:8:2] & 0x0F) << 4)
        parts = [whole.reshape(groups), nibbles.reshape(groups)]
    else:
        # quad r (r < 4) in the low nibbles of row r, quad r + 4 in its high nibbles; then (5-bit codes) a
        # 64-byte plane whose bit r is bit 4 of quad r
        low = (quads[:, :, :4] & 0x0F) | ((quads[:, :, 4:] & 0x0F) << 4)
        parts = [low.reshape(groups)]
        for bit in range(4, fmt.bits):
            plane = np.packbits((quads >> bit) & 1, axis=2, bitorder="little")  # 8 quads -> 1 byte
            parts.append(plane.reshape(groups))
    # on huge pages, as every resident weight (a decode step streams them all: sarathi/model/huge_pages.py)
    packed = huge_pages.empty((tiles, cols // GROUP, sum(p.shape[-1] for p in parts)), torch.uint8)
    np.concatenate(parts, axis=-1, out=packed.numpy())

    def tensor(a: np.ndarray | None) -> torch.Tensor:
        return torch.empty(0) if a is None else _tiled(a, tiles)

    return PackedQuant(
        rows,
        cols,
        fmt.code_kind,
        fmt.sub,
        fmt.zero,
        packed,
        tensor(u.d),
        tensor(u.dm),
        tensor(u.sc),
        tensor(u.mc),
    )
