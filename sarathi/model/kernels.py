"""Our C++ CPU kernels (AVX-512), built from source on first use:

- `gemm`: bf16 GEMM with float32 accumulation and float32 output (AVX512-BF16, `csrc/bf16_gemm.cpp`; on
  AMX tiles from 2 rows where the CPU has them, Intel Xeon Sapphire Rapids on: `amx()`, `csrc/amx_tiles.h`).
  PyTorch's CPU bf16 matmuls round every output to bf16; on SmolLM2 that extra rounding per layer puts the
  bf16 model's logits error ~1.3x above the floor of "bf16 GEMM inputs, float32 accumulation" (see
  `benchmarks/bf16_error_budget.py`).
- `decode_attention`: one-token queries over the paged KV cache read in place (no gather of the context
  into a buffer), float32 math over bf16 or float32 K/V (`csrc/decode_attention.cpp`; AVX2 build
  `csrc/decode_attention_avx2.cpp`).
- `chunk_attention`: a prefill chunk's queries over the bf16 paged cache read in place, causal (and
  windowed), bf16 products with float32 sums and softmax (`csrc/chunk_attention.cpp`).
- `argmax_rows`: torch.argmax(dim=-1) for float32 logits, vectorized (`csrc/argmax.cpp`).
- `rms_norm_f32`: RMSNorm of float32 rows in one pass (`csrc/elementwise_avx2.cpp`, AVX2): the float32
  layers' norm.
- `silu_mul`, `gelu_mul`, `add_rms_norm`, `norm_add_rms_norm`: a layer's elementwise steps fused, one pass
  each, with bf16 results for bf16 math (`csrc/elementwise.cpp`) or float32 results for float32 layers
  (`csrc/elementwise_avx2.cpp`).
- `rope_write_kv`: RoPE on q and k and the KV-cache write of k and v, one pass over qkv (`csrc/rope_kv.cpp`;
  AVX2 build `csrc/rope_kv_avx2.cpp`).
- `quant_gemm`: x @ W^T for a weight kept in its GGUF quantization, codes decoded to bf16 in registers,
  float32 sums (`csrc/quant_gemm.cpp`, layout from `sarathi/model/quantized.py`; many rows on AMX tiles
  where the CPU has them).
- `quant_rows`: rows of such a weight dequantized to float32: a quantized token table's lookup
  (`csrc/quant_rows.cpp`).
- `decode_layers`: consecutive Llama-family layers over decodes only, their quantized GEMVs and fused steps
  in one call, and the final norm and LM head after the last (`csrc/decode_layer.cpp`; what it takes and
  how layers are grouped into its runs: `sarathi/model/decode_run.py`).
- `rope_tables`: RoPE's cos and sin tables for a batch of positions, one call (`csrc/rope_tables.cpp`).
- `mask_logits_by_bitmask`: structured outputs' packed token bitmask applied to logit rows in place
  (`csrc/token_bitmask.cpp`).

The extension is compiled with the C++ compiler `torch.utils.cpp_extension` finds, once per source and torch
version, into the sarathi cache folder (about a minute on 2 cores; later processes load the cached library).
Where that cannot happen (no compiler, a CPU without AVX512-BF16, or `SARATHI_KERNELS=0`) `available()` is
False, a one-line notice says why, and callers keep PyTorch's kernels. On a CPU with AVX2 but without
AVX512-BF16 (AMD Zen 2/3, older Intel Xeons) the kernels with an AVX2 build still run: the quantized-weight
kernels (`csrc/quant_gemm_avx2.cpp`), `rms_norm_f32`, the float32 fused steps, `decode_attention`,
`rope_write_kv` and `decode_layers`: `portable_available()`. Where AVX-512 VNNI runs without AVX512-BF16
(Intel Cascade Lake, Ice Lake: `level()` "vnni") `quant_gemm` multiplies on AVX-512 VNNI, at any row count,
and the rest is the AVX2 builds; on AVX-512 without VNNI (Intel Skylake-SP: "avx512bw") the same with
VPMADDWD in VPDPBUSD's place. `SARATHI_KERNELS=avx2` (or `vnni`, `avx512bw`) runs an AVX-512 CPU as such a
CPU would run: to test and time those paths there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import torch

from sarathi.model import huge_pages
from sarathi.model.embedded import cache_root
from sarathi.model.quantized import PackedQuant

logger = logging.getLogger(__name__)

_SOURCES = sorted((Path(__file__).parent / "csrc").glob("*.cpp"))
_HEADERS = sorted((Path(__file__).parent / "csrc").glob("*.h"))
_FLAGS = ["-O3", "-fopenmp"]
# The levels of a CPU without AVX512-BF16 (what SARATHI_KERNELS may force on one with it): the AVX2 builds,
# with quant_gemm's int8 path on AVX-512 VNNI ("vnni"), on AVX-512 BW alone ("avx512bw") or on AVX2 ("avx2").
_INT8_ON = {"vnni": " (their int8 products on AVX-512 VNNI)", "avx512bw": " (their int8 products on AVX-512)"}
_WITHOUT_BF16 = ("avx2", "avx512bw", "vnni")
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool, "why": str once decided
_decided: str | None = None  # _state["level"] once decided


def source_digest() -> str:
    """Identifies this build of the kernels (sources, headers, flags, torch): timings measured with one
    build are not taken for another's."""
    key = hashlib.sha256(torch.__version__.encode() + " ".join(_FLAGS).encode())
    for source in [*_SOURCES, *_HEADERS]:
        key.update(source.name.encode() + source.read_bytes())
    return key.hexdigest()[:16]


def _build_dir() -> Path:
    return cache_root() / "kernels" / f"sarathi_kernels-{source_digest()}"


def _load() -> tuple[str, str]:
    """Build or load the extension: ('full' | 'quant' | 'none', why not full)."""
    if os.environ.get("SARATHI_KERNELS", "1") == "0":
        return "none", "SARATHI_KERNELS=0"
    try:
        from torch.utils.cpp_extension import load
    except ImportError as exc:  # pragma: no cover - part of torch
        return "none", f"torch.utils.cpp_extension unavailable ({exc})"
    build_dir = _build_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        load(
            name="sarathi_kernels",
            sources=[str(s) for s in _SOURCES],
            extra_cflags=_FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:  # a missing compiler or failed build: keep PyTorch's kernels
        return "none", f"build failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if torch.ops.sarathi_kernels.cpu_supported():
        return "full", ""
    if torch.ops.sarathi_kernels.cpu_portable_supported():
        choice = os.environ.get("SARATHI_KERNELS")
        why = f"SARATHI_KERNELS={choice}" if choice in _WITHOUT_BF16 else "this CPU lacks AVX512-BF16"
        return str(torch.ops.sarathi_kernels.cpu_int8_isa()), why
    return "none", "this CPU lacks AVX512-BF16 and AVX2"


def _level() -> str:
    global _decided
    # decided once: read without the lock after that (a model's forward asks several times a step, and on
    # the caches a step's streamed weights leave cold the lock and dict took ~25 us each)
    if _decided is not None:
        return _decided
    with _lock:
        if "level" not in _state:
            level, why = _load()
            _state["level"], _state["why"] = level, why
            if level in _WITHOUT_BF16:
                logger.warning(
                    "sarathi's AVX-512 kernels unavailable (%s): PyTorch's kernels, with our AVX2 kernels "
                    "for quantized weights%s, decode attention, RoPE and RMSNorm",
                    why,
                    _INT8_ON.get(level, ""),
                )
            elif level == "none":
                logger.warning("sarathi's CPU kernels unavailable (%s): using PyTorch's kernels", why)
        _decided = str(_state["level"])
        return _decided


def level() -> str:
    """Which kernels run here: "full" (AVX-512 with BF16), "vnni" (the AVX2 builds, quantized products on
    AVX-512 VNNI), "avx512bw" (the same on AVX-512 without VNNI), "avx2" (the AVX2 builds) or "none"; builds
    the extension on the first call."""
    return _level()


def status() -> str | None:
    """What the kernels' first use found, e.g. "full" or "avx2 (SARATHI_KERNELS=avx2)"; None before it
    (asking builds nothing)."""
    with _lock:
        if "level" not in _state:
            return None
        return str(_state["level"]) + (f" ({_state['why']})" if _state["why"] else "")


def available() -> bool:
    """Whether every kernel is built, loaded and runnable on this CPU (AVX-512 with BF16 and VNNI; builds
    the extension on the first call)."""
    return _level() == "full"


def amx() -> bool:
    """Whether the bf16 GEMMs of many rows (`gemm`, `quant_gemm`'s dequantized tiles) run on AMX tiles here:
    an Intel Xeon from Sapphire Rapids on, with the "full" level and not SARATHI_AMX=0."""
    return available() and bool(torch.ops.sarathi_kernels.amx_bf16_ready())


def portable_available() -> bool:
    """Whether the kernels with an AVX2 build run here (`quant_gemm`, `quant_linear`, `quant_rows`,
    `rms_norm_f32` and the float32 fused steps, `decode_attention`, `rope_write_kv`, `decode_layers` over
    float32 layers): every AVX-512 BF16 CPU, and any with AVX2, FMA and F16C."""
    return _level() in ("full", *_WITHOUT_BF16)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's layout of a [N, K] weight (K even), as bf16, on huge pages (a decode step streams it:
    huge_pages.py); builds or loads the kernel if needed."""
    if not available():
        raise RuntimeError(f"sarathi's CPU kernels unavailable: {_state['why']}")
    if weight.dim() != 2:
        raise ValueError(f"pack: weight must be 2-D, got {weight.dim()}-D")
    n, k = weight.shape
    out = huge_pages.empty((-(-n // 16), k // 2, 16, 2), torch.bfloat16)
    torch.ops.sarathi_kernels.bf16_gemm_pack(weight, out)
    return out


def gemm(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] (bf16, or float32 rounded to bf16) times the packed weight, + bias: float32 [..., N]."""
    y = torch.ops.sarathi_kernels.bf16_gemm(x.reshape(-1, x.shape[-1]), packed, out_features, bias)
    return y.view(*x.shape[:-1], out_features)


def quant_gemm(x: torch.Tensor, w: PackedQuant, out: torch.Tensor, int8_rows: int = -1) -> None:
    """out (float32 [M, w.rows], rows may be strided) = x [M, w.cols] (float32 or bf16; the many-rows path
    rounds it to bf16, the few-rows path quantizes it as given) times the quantized weight's transpose.
    Up to `int8_rows` rows take the few-rows (int8) path; -1 leaves it to this CPU (`quant_int8_rows`)."""
    torch.ops.sarathi_kernels.quant_gemm(
        x, w.codes, w.d, w.sc, w.dm, w.mc, w.bits, w.sub, w.zero, out, int8_rows
    )


def quant_int8_rows(bits: int) -> int:
    """Rows of x up to which `quant_gemm` multiplies x in two int8 terms in this process, for `bits`-bit codes
    (more rows: x rounded to bf16, or float32 on the AVX2 path; at the "vnni" and "avx512bw" levels every row
    count: 2**63 - 1): the machine's measured threshold once a quantized model is loaded, else the kernel's
    own."""
    return torch.ops.sarathi_kernels.quant_int8_rows(bits)


def quant_dequant_rows(offsets: bool) -> int:
    """Rows of x from which `quant_gemm` (past the int8 path's rows) multiplies bf16 x against tiles
    dequantized to bf16 weights rather than against the file's exact values, for formats with (`offsets`) or
    without an m term (2**63 - 1 where no build has that path: the AVX2 one)."""
    return torch.ops.sarathi_kernels.quant_dequant_rows(offsets)


def quant_dequant_rows_builtin(offsets: bool) -> int:
    """The kernel's own `quant_dequant_rows` for this CPU kind, which it gives until `set_quant_dequant_rows`
    sets another."""
    return torch.ops.sarathi_kernels.quant_dequant_rows_builtin(offsets)


def set_quant_dequant_rows(offsets: bool, rows: int) -> None:
    """Set `quant_dequant_rows(offsets)` for this process; -1 restores the kernel's own threshold."""
    torch.ops.sarathi_kernels.set_quant_dequant_rows(offsets, rows)


def quant_int8_rows_builtin(bits: int) -> int:
    """The kernel's own threshold for this CPU kind (measured on a few kinds), which `quant_int8_rows` gives
    until `set_quant_int8_rows` sets another (`quant_path_tuning` times the machine's own)."""
    return torch.ops.sarathi_kernels.quant_int8_rows_builtin(bits)


def set_quant_int8_rows(bits: int, rows: int) -> None:
    """Set `quant_int8_rows(bits)` for this process; -1 restores the kernel's own threshold."""
    torch.ops.sarathi_kernels.set_quant_int8_rows(bits, rows)


def quant_linear(x: torch.Tensor, w: PackedQuant) -> torch.Tensor:
    """`quant_gemm` into a new float32 [M, w.rows] output."""
    return torch.ops.sarathi_kernels.quant_linear(
        x, w.codes, w.d, w.sc, w.dm, w.mc, w.bits, w.sub, w.zero, w.rows
    )


def rms_norm_f32(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    rows: torch.Tensor | None = None,
    bf16: bool = False,
) -> torch.Tensor:
    """x / rms(x) * weight over the last dimension of contiguous float32 x, one pass per row (needs
    `portable_available()`: AVX2 code); with `rows` (int64 [K], x [T, n]) only those rows, in order; float32,
    or with `bf16` rounded as `.to(torch.bfloat16)` rounds."""
    return torch.ops.sarathi_kernels.rms_norm_f32(x, weight, eps, rows, bf16)


def quant_rows(ids: torch.Tensor, w: PackedQuant) -> torch.Tensor:
    """float32 [len(ids), w.cols]: rows ``ids`` of the quantized weight, dequantized exactly."""
    return torch.ops.sarathi_kernels.quant_rows(
        ids, w.codes, w.d, w.sc, w.dm, w.mc, w.rows, w.bits, w.sub, w.zero
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """q [B, heads, d] over each row's first `context_lens[b]` cached keys (with `window` > 0, only the last
    `window` of them): float32 [B, heads * d]."""
    return torch.ops.sarathi_kernels.decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, window
    )


def mask_logits_by_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: float32 logits row rows[k] gets -inf wherever bit row k of the int32 bitmask is 0."""
    torch.ops.sarathi_kernels.mask_logits_by_bitmask(logits, bitmask, rows)


def _fused_op(name: str, dtype: torch.dtype):
    """The fused step `name` with `dtype` results: bf16 (bf16 math, `csrc/elementwise.cpp`) or float32
    (float32 layers, `csrc/elementwise_avx2.cpp`)."""
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{name}: results are bf16 or float32, not {dtype}")
    return getattr(torch.ops.sarathi_kernels, f"{name}_{'bf16' if dtype == torch.bfloat16 else 'f32'}")


def silu_mul(gate_up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """silu(gate) * up from float32 [T, 2I] = [gate | up]: [T, I] in `dtype` (bf16 rounded to nearest even,
    or float32)."""
    return _fused_op("silu_mul", dtype)(gate_up)


def gelu_mul(gate_up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """gelu_tanh(gate) * up from gate_up's float32 [T, 2I] (Gemma's MLP), in `dtype`."""
    return _fused_op("gelu_mul", dtype)(gate_up)


def norm_add_rms_norm(
    residual: torch.Tensor,
    x: torch.Tensor,
    w_x: torch.Tensor,
    w_next: torch.Tensor | None,
    eps: float,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Gemma's sandwich step: residual += rms_norm(x) * w_x in place (float32 [T, H]); returns
    rms_norm(residual) * w_next in `dtype`, or None without `w_next`."""
    out = _fused_op("norm_add_rms_norm", dtype)(residual, x, w_x, w_next, eps)
    return out if w_next is not None else None


def add_rms_norm(
    residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """residual += x in place (float32 [T, H]; skipped when x is None); returns rms_norm(residual) * weight
    in `dtype`."""
    return _fused_op("add_rms_norm", dtype)(residual, x, weight, eps)


def rope_write_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    heads: int,
    return_kv: bool,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Rotate q and k of qkv (float32 [T, heads + 2 * kv_heads, d]) by the `rope_cos_sin` tables and write k
    and v into the caches at `slot_mapping`. Returns q (float32 [T, heads, d]) and, with `return_kv`, k and v
    as the cache stores them, widened to float32 [T, kv_heads, d]; else None for both. `qk_norm` (q and k
    weights [d], eps): RMS-normalize each q and k head first."""
    q_w, k_w, eps = qk_norm if qk_norm is not None else (None, None, 1e-6)
    q, k, v = torch.ops.sarathi_kernels.rope_write_kv(
        qkv, cos, sin, k_cache, v_cache, slot_mapping, heads, return_kv, q_w, k_w, eps
    )
    return (q, k, v) if return_kv else (q, None, None)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope.rope_cos_sin`'s tables (float32 [T, 1, 2 * len(inv_freq)]) for int64 positions [T], each value
    the float32 angle's cosine or sine computed in double and rounded once (needs `portable_available()`)."""
    return torch.ops.sarathi_kernels.rope_tables(positions, inv_freq)


def rope_kernel_serves(head_dim: int, cache: torch.Tensor) -> bool:
    """Whether `rope_write_kv` handles this head size and cache (head_dim a multiple of 32, CPU, bf16 or
    float32 cache)."""
    return (
        head_dim % 32 == 0
        and cache.device.type == "cpu"
        and cache.dtype in (torch.bfloat16, torch.float32)
        and portable_available()
    )


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for a [rows, vocab] tensor: our kernel on CPU where it runs."""
    if logits.device.type != "cpu" or logits.dim() != 2 or logits.shape[1] == 0 or not available():
        return logits.argmax(dim=-1)
    return torch.ops.sarathi_kernels.argmax_rows(logits)


def main() -> None:
    """Build (or load) the kernels now and say whether they run here (`make kernels`)."""
    import time

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    start = time.perf_counter()
    level = _level()
    took = time.perf_counter() - start
    said = {
        "full": "ready",
        "vnni": "AVX2 kernels ready (quantized weights on AVX-512 VNNI, attention, RoPE, RMSNorm), PyTorch's "
        "for the rest",
        "avx512bw": "AVX2 kernels ready (quantized weights on AVX-512, attention, RoPE, RMSNorm), PyTorch's "
        "for the rest",
        "avx2": "AVX2 kernels ready (quantized weights, attention, RoPE, RMSNorm), PyTorch's for the rest",
        "none": "unavailable, using PyTorch kernels",
    }[level]
    print(f"sarathi kernels: {said} ({took:.1f} s)")


def chunk_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    first_key: int,
    start: int,
    window: int,
    scale: float,
) -> torch.Tensor:
    """A prefill chunk's q [n, heads, d] (first token at `start`) over the bf16 cache, read in place:
    `block_table` holds its keys from `first_key` on; query i sees keys <= start + i (with `window` > 0,
    the `window` latest). bf16 products, float32 sums and softmax: float32 [n, heads * d]."""
    return torch.ops.sarathi_kernels.chunk_attention(
        q, k_cache, v_cache, block_table, first_key, start, window, scale
    )
