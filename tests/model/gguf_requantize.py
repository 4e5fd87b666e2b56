"""Writing GGUF blocks of the types the `gguf` package reads but cannot write (Q2_K, Q3_K, IQ4_NL, IQ4_XS), by
plain round-to-nearest, and a copy of a GGUF file with chosen tensors re-encoded: files of those types for
tests, without llama.cpp. The encoders need not match llama-quantize's choices, only make valid blocks;
what the blocks mean is the `gguf` package's dequantization."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

KVALUES = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)  # ascending


def _two_bytes(x: np.ndarray) -> np.ndarray:
    """[n] float16 or uint16 -> [n, 2] bytes, little-endian."""
    return x.view(np.uint8).reshape(-1, 2)


def _signed_scale(w: np.ndarray, extreme: float) -> np.ndarray:
    """Per row of w: the scale mapping its largest-magnitude value to `extreme` (0 for an all-zero row)."""
    at = np.abs(w).argmax(-1)
    return np.take_along_axis(w, at[:, None], -1)[:, 0] / extreme


def _nearest_kvalue(v: np.ndarray) -> np.ndarray:
    """Index of the table value nearest to each of v."""
    mids = (KVALUES[1:] + KVALUES[:-1]) / 2
    return np.searchsorted(mids, v).astype(np.uint8)


def _divide(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    return np.divide(w, s, out=np.zeros_like(w), where=s != 0)


def _nibble_pairs(idx: np.ndarray) -> np.ndarray:
    """[n, 32] 4-bit values -> [n, 16] bytes: value i in byte i's low nibble, value 16 + i in its high."""
    return idx[:, :16] | (idx[:, 16:] << 4)


def encode_iq4_nl(w: np.ndarray) -> np.ndarray:
    """[n * 32] float32 -> [n, 18] IQ4_NL blocks."""
    w = w.reshape(-1, 32)
    d = _signed_scale(w, KVALUES[0]).astype(np.float16)
    idx = _nearest_kvalue(_divide(w, d.astype(np.float32)[:, None]))
    return np.concatenate([_two_bytes(d), _nibble_pairs(idx)], axis=1)


def _sub_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sub-block scales [n, subs] -> (d float16 [n], 6-bit multipliers sc in -32..31 [n, subs]) with
    d * sc ~ s."""
    d = (np.abs(s).max(-1) / 31).astype(np.float16)
    sc = np.clip(np.round(_divide(s, d.astype(np.float32)[:, None])), -32, 31).astype(np.int8)
    return d, sc


def encode_iq4_xs(w: np.ndarray) -> np.ndarray:
    """[n * 256] float32 -> [n, 136] IQ4_XS blocks."""
    w = w.reshape(-1, 8, 32)
    n = w.shape[0]
    d, sc = _sub_scales(_signed_scale(w.reshape(-1, 32), KVALUES[0]).reshape(n, 8))
    step = d.astype(np.float32)[:, None] * sc
    idx = _nearest_kvalue(_divide(w, step[..., None])).reshape(-1, 32)
    u = (sc.astype(np.int16) + 32).astype(np.uint16)
    high = ((u >> 4) << np.arange(0, 16, 2, dtype=np.uint16)).sum(-1).astype(np.uint16)
    low = (u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)
    return np.concatenate(
        [
            _two_bytes(d),
            _two_bytes(high),
            low.astype(np.uint8),
            _nibble_pairs(idx).reshape(n, 128),
        ],
        axis=1,
    )


def _two_bit_bytes(code: np.ndarray) -> np.ndarray:
    """[n, 256] codes -> [n, 64] bytes of their low two bits: weight 128h + 32s + i at bits 2s..2s+1 of byte
    32h + i."""
    n = code.shape[0]
    low = (code & 3).reshape(n, 2, 4, 32) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    return np.bitwise_or.reduce(low, axis=2).reshape(n, 64)


def encode_q2_k(w: np.ndarray) -> np.ndarray:
    """[n * 256] float32 -> [n, 84] Q2_K blocks (codes q in 0..3, weight d * sc * q - dmin * m per 16)."""
    w = w.reshape(-1, 16, 16)
    n = w.shape[0]
    low = np.minimum(w.min(-1), 0.0)
    dmin = (-low.min(-1) / 15).astype(np.float16)
    m = np.clip(np.round(_divide(-low, dmin.astype(np.float32)[:, None])), 0, 15).astype(np.uint8)
    base = dmin.astype(np.float32)[:, None] * m
    step_wanted = (w.max(-1) + base) / 3  # q = 3 reaches the sub-block's max
    d = (step_wanted.max(-1) / 15).astype(np.float16)
    sc = np.clip(np.round(_divide(step_wanted, d.astype(np.float32)[:, None])), 0, 15).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc
    code = np.clip(np.round(_divide(w + base[..., None], step[..., None])), 0, 3).astype(np.uint8)
    return np.concatenate(
        [
            sc | (m << 4),
            _two_bit_bytes(code.reshape(n, 256)),
            _two_bytes(d),
            _two_bytes(dmin),
        ],
        axis=1,
    )


def encode_q3_k(w: np.ndarray) -> np.ndarray:
    """[n * 256] float32 -> [n, 110] Q3_K blocks (codes q in -4..3, weight d * sc * q)."""
    w = w.reshape(-1, 16, 16)
    n = w.shape[0]
    d, sc = _sub_scales(_signed_scale(w.reshape(-1, 16), -4.0).reshape(n, 16))
    step = d.astype(np.float32)[:, None] * sc
    code = (np.clip(np.round(_divide(w, step[..., None])), -4, 3) + 4).astype(np.uint8).reshape(n, 256)
    # weight 128h + 32s + i: its high bit at bit 4h + s of hmask byte i
    qs = _two_bit_bytes(code)
    high = (code >> 2).reshape(n, 8, 32) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    hmask = np.bitwise_or.reduce(high, axis=1)
    u = (sc.astype(np.int16) + 32).astype(np.uint8)
    scales = np.concatenate(
        [
            (u[:, :8] & 0xF) | ((u[:, 8:] & 0xF) << 4),
            np.bitwise_or.reduce(
                (u >> 4).reshape(n, 4, 4) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1), axis=1
            ),
        ],
        axis=1,
    )
    return np.concatenate([hmask, qs, scales, _two_bytes(d)], axis=1)


ENCODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q2_K": encode_q2_k,
    "Q3_K": encode_q3_k,
    "IQ4_NL": encode_iq4_nl,
    "IQ4_XS": encode_iq4_xs,
}


def encode(w: np.ndarray, qtype: str) -> np.ndarray:
    """float32 [rows, cols] -> [rows, bytes per row] blocks of `qtype`."""
    return ENCODERS[qtype](np.ascontiguousarray(w, dtype=np.float32)).reshape(w.shape[0], -1)


def requantized_copy(src: Path, dst: Path, choose: Callable[[str, tuple[int, int]], str | None]) -> None:
    """Copy the GGUF `src` to `dst`, each 2-D tensor re-encoded as `choose(name, (rows, cols))` says (None:
    kept as it is), every metadata field kept."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))
        qtype = choose(t.name, shape) if len(shape) == 2 else None
        if qtype is None:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        writer.add_tensor(t.name, encode(w, qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
