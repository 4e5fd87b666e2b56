"""quant_gemm's int8-path threshold per code width (and for IQ4's table indices, code kind 40), and the rows
from which it multiplies dequantized tiles, timed on this machine.

`quant_gemm` has two paths, both over exactly the file's codes: up to `kernels.quant_int8_rows(bits)` rows of
x it multiplies x in two int8 terms (VPDPBUSD; VPMADDUBSW on the AVX2 builds), more rows decode each chunk of
codes to bf16 (float32 on the AVX2 builds) once and reuse it for every row. Where the two cross depends on the
core, not only on its instruction set: with the same AVX-512 VNNI and BF16, a Zen4 found the tile path the
faster above 4 rows of 4-bit codes and a Zen5 the int8 path up to 32 (128 before the tile path's sums ran
in twice the chains). The kernel carries a table for the CPU kinds we measured (`quant_int8_rows_builtin`);
this module times both paths on the machine at hand instead:

- weights at Llama 3.2 1B's MLP shapes (8,192 x 2,048 and its transpose), every format of a code width,
  cycled from memory (copies past the last-level cache), at 8, 16, ..., 256 rows of x, the two paths called
  in turn (a drifting memory rate cancels out of each pair), and a step the int8 path loses timed once more
  (each path's faster median kept: other processes only ever add time);
- a width's threshold is the most rows up to which the int8 path, summed over the width's formats and both
  shapes, took no longer than the tile path at every step; at least 4 (a decode's few rows: the int8 path
  streams the codes undecoded, the reason it exists);
- the choice is kept in the cache folder, keyed by the CPU, the kernel build and the kernel level, so every
  process on the machine takes the same one; `apply()` (called by the loader for a quantized model) times it
  on first use, a few seconds once, and sets it in the kernel.

Past the int8 path's rows, the kernel's many-rows path decodes each chunk straight to bf16 weights (one
rounding each) and multiplies them as the bf16 GEMM does, with no work per sub-block; from how many rows it
beats the tile path is timed first, the same way, for formats with offsets (an m term) and without:

- at 16, 32, ..., 128 rows, from the most rows down, the two paths called in turn; a format whose dequantized
  path is clearly slower at a step is not timed at fewer rows;
- a kind's threshold is the fewest rows from which the dequantized path, summed over the kind's formats and
  both shapes, took no longer than the tile path at that step and every larger one (where it lost even at 128,
  the kernel's own stands). On a Zen5 that was 32 rows with offsets and 48 without (the kernel's: 48 and 96).

`SARATHI_INT8_ROWS=builtin` keeps the kernel's table (both thresholds); `SARATHI_DEQUANT_ROWS=N` sets both
dequantized-tile thresholds instead of the timed ones. At the "vnni" and "avx512bw" levels
the int8 path is the only AVX-512 one and takes every row count: nothing to time.
`python -m sarathi.model.quant_path_tuning [--again]` prints this machine's choice with the timings behind it
(and times it again).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from sarathi.cpu_identity import cpu_identity
from sarathi.model import kernels, quantized
from sarathi.model.embedded import cache_root

logger = logging.getLogger(__name__)

#: The formats timed for each code width (the widths the kernel's threshold is kept by; IQ4's table indices
#: are a kind of their own: decoded as 4-bit codes, multiplied as 8-bit ones on the AVX2 build).
WIDTH_FORMATS = {
    4: ("Q4_0", "Q4_1", "Q4_K"),
    5: ("Q5_0", "Q5_K"),
    6: ("Q6_K",),
    8: ("Q8_0",),
    quantized.IQ4_CODES: ("IQ4_NL", "IQ4_XS"),
    3: ("Q3_K",),
    2: ("Q2_K",),
}
#: Llama 3.2 1B's MLP: the up projection (outputs, inputs) and the down projection.
SHAPES = {"up": (8192, 2048), "down": (2048, 8192)}
ROW_STEPS = (8, 16, 32, 64, 128, 256)
DEQUANT_STEPS = (128, 96, 64, 48, 32, 16)  # from the most rows down
MIN_ROWS = 4
PAIRS = 3
# A format whose int8 path takes this much longer than its tile path is not timed at more rows (it only
# falls further behind as rows grow), which keeps the timing to seconds where the crossover is low.
CLEARLY_SLOWER = 1.25
STREAM_BYTES = 128 * 2**20  # copies cycled per timed call: well past any L3 of the machines we run on
ENV = "SARATHI_INT8_ROWS"
DEQUANT_ENV = "SARATHI_DEQUANT_ROWS"  # read by the kernel: both dequantized-tile thresholds, for measurements


def random_weight(qtype: str, rows: int, cols: int) -> quantized.PackedQuant:
    """A weight of random valid blocks in the kernel's layout (float16 fields drawn small)."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(0)
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)

    def halves() -> np.ndarray:
        return rng.uniform(1e-4, 1e-3, n).astype(np.float16).view(np.uint8).reshape(n, 2)

    # where each type keeps its float16 scale (and offset scale)
    d_offset = {"Q6_K": 208, "Q3_K": 108, "Q2_K": 80}.get(qtype, 0)
    raw[:, d_offset : d_offset + 2] = halves()
    if quantized.FORMATS[qtype].offsets:
        raw[:, d_offset + 2 : d_offset + 4] = halves()
    t = quantized.QuantizedTensor(qtype, rows, cols, torch.from_numpy(raw.reshape(rows, -1)))
    return quantized.pack(quantized.unpack(t))


def copies_past_cache(w: quantized.PackedQuant) -> list[quantized.PackedQuant]:
    """Copies of w in separate memory, enough that each call reads its weight from DRAM, not from cache."""
    n = max(2, -(-STREAM_BYTES // w.nbytes))
    fields = ("codes", "d", "dm", "sc", "mc")
    return [dataclasses.replace(w, **{f: getattr(w, f).clone() for f in fields}) for _ in range(n)]


def alternating_medians(
    a: Callable[[], object], b: Callable[[], object], repeats: int
) -> tuple[float, float, float]:
    """Median seconds of a and of b, called in turn, and the median of their per-pair ratio a / b (pairs
    taken moments apart, so a drifting memory rate cancels out of the ratio)."""
    a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((a, ta), (b, tb)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    ratio = statistics.median(x / y for x, y in zip(ta, tb, strict=True))
    return statistics.median(ta), statistics.median(tb), ratio


@dataclass(frozen=True)
class PathTiming:
    """Both paths' median time for one format, shape and row count."""

    format: str
    shape: str
    rows: int
    int8_ms: float
    tile_ms: float


@dataclass(frozen=True)
class DequantTiming:
    """The dequantized-tile path's and the tile path's median time for one format, shape and row count."""

    format: str
    shape: str
    rows: int
    dequant_ms: float
    tile_ms: float


@dataclass
class Int8Rows:
    """This machine's threshold per code width, the rows from which the dequantized-tile path takes over (by
    whether a format has offsets; -1: the kernel's own), the timings behind them, and what they are keyed
    on."""

    rows: dict[int, int]
    timings: list[PathTiming]
    seconds: float
    key: dict
    dequant_rows: dict[bool, int] = dataclasses.field(default_factory=dict)
    dequant_timings: list[DequantTiming] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "rows": {str(b): r for b, r in self.rows.items()},
            "dequant_rows": {"offsets" if o else "plain": r for o, r in self.dequant_rows.items()},
            "seconds": round(self.seconds, 1),
            "timings": [dataclasses.asdict(t) for t in self.timings],
            "dequant_timings": [dataclasses.asdict(t) for t in self.dequant_timings],
        }

    @classmethod
    def from_json(cls, d: dict) -> Int8Rows:
        return cls(
            rows={int(b): int(r) for b, r in d["rows"].items()},
            timings=[PathTiming(**t) for t in d["timings"]],
            seconds=float(d["seconds"]),
            key=d["key"],
            dequant_rows={k == "offsets": int(r) for k, r in d["dequant_rows"].items()},
            dequant_timings=[DequantTiming(**t) for t in d["dequant_timings"]],
        )


def threshold(timings: list[PathTiming], formats: tuple[str, ...]) -> int:
    """The most rows (a step of ROW_STEPS, at least MIN_ROWS) up to which the int8 path, summed over
    `formats` and SHAPES, took no longer than the tile path at every step; a step where any of them went
    untimed ends it."""
    best = MIN_ROWS
    for rows in ROW_STEPS:
        at = [t for t in timings if t.rows == rows and t.format in formats]
        if len(at) < len(formats) * len(SHAPES) or sum(t.int8_ms for t in at) > sum(t.tile_ms for t in at):
            break
        best = rows
    return best


def best_of_two(first: tuple[float, ...], second: tuple[float, ...]) -> tuple[float, float, float]:
    """Each path's faster median of two timings, and their ratio. Another process on the machine only ever
    adds time: one burst of it during a single timing once made a 64-row step of Q4_K look 1.6x slower on
    the int8 path (its neighbours 0.7x), which stopped that format's timing there and kept a 4-bit
    threshold of 64 for a machine whose crossover lies past 256 rows."""
    int8_s, tile_s = min(first[0], second[0]), min(first[1], second[1])
    return int8_s, tile_s, int8_s / tile_s


def dequant_threshold(timings: list[DequantTiming], formats: tuple[str, ...]) -> int:
    """The fewest rows of DEQUANT_STEPS from which the dequantized-tile path, summed over `formats` and
    SHAPES, took no longer than the tile path at that step and every larger one; -1 (the kernel's own) where
    it lost at the largest. A step where any of them went untimed ends it."""
    best = -1
    for rows in DEQUANT_STEPS:
        at = [t for t in timings if t.rows == rows and t.format in formats]
        if len(at) < len(formats) * len(SHAPES) or sum(t.dequant_ms for t in at) > sum(t.tile_ms for t in at):
            break
        best = rows
    return best


def dequant_kinds() -> dict[bool, tuple[str, ...]]:
    """The timed formats by whether they have offsets (the kernel keeps a dequantized-path threshold for
    each)."""
    formats = tuple(itertools.chain(*WIDTH_FORMATS.values()))
    return {o: tuple(f for f in formats if quantized.FORMATS[f].offsets == o) for o in (False, True)}


def restore_dequant_rows(before: dict[bool, int]) -> None:
    """Put back the kernel's dequantized-tile thresholds read before a timing (-1 where it had its own)."""
    for o, r in before.items():
        kernels.set_quant_dequant_rows(o, -1 if r == kernels.quant_dequant_rows_builtin(o) else r)


def measure_dequant_rows(
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[bool, int], list[DequantTiming]]:
    """Time the tile and dequantized-tile paths of `quant_gemm` here (the int8 path off) and choose the rows
    from which the dequantized one is taken, with offsets and without; nothing where this build has no such
    path (the AVX2 one). The kernel's thresholds are as before on return."""
    if kernels.quant_dequant_rows_builtin(False) >= 2**62:
        return {}, []
    before = {o: kernels.quant_dequant_rows(o) for o in (False, True)}
    timings: list[DequantTiming] = []
    try:
        for offsets, formats in dequant_kinds().items():
            for qtype, shape in itertools.product(formats, SHAPES):
                n, k = SHAPES[shape]
                ring = itertools.cycle(copies_past_cache(random_weight(qtype, n, k)))
                for rows in DEQUANT_STEPS:
                    x, out = torch.randn(rows, k), torch.empty(rows, n)

                    def path(from_rows: int, x=x, out=out, ring=ring, offsets=offsets) -> Callable[[], None]:
                        def call() -> None:
                            kernels.set_quant_dequant_rows(offsets, from_rows)
                            kernels.quant_gemm(x, next(ring), out, int8_rows=0)

                        return call

                    dq, tile = path(1), path(2**62)
                    dq_s, tile_s, ratio = alternating_medians(dq, tile, PAIRS)
                    if ratio > 1.0:  # a verdict against the dequantized path is timed twice: see best_of_two
                        again = alternating_medians(dq, tile, PAIRS)
                        dq_s, tile_s, ratio = best_of_two((dq_s, tile_s), again)
                    ms = round(dq_s * 1e3, 3), round(tile_s * 1e3, 3)
                    timings.append(DequantTiming(qtype, shape, rows, *ms))
                    if progress is not None:
                        progress(f"{qtype:5s} {shape:5s} {rows:4d} rows: dequantized {ratio:.2f}x the tile's")
                    if ratio > CLEARLY_SLOWER:
                        break
                del ring
    finally:
        restore_dequant_rows(before)
    return {o: dequant_threshold(timings, formats) for o, formats in dequant_kinds().items()}, timings


def measure(progress: Callable[[str], None] | None = None) -> Int8Rows:
    """Time the paths of `quant_gemm` here: first the rows from which the dequantized-tile path takes over,
    then, with those set, each code width's int8-path threshold."""
    start = time.perf_counter()
    dequant_rows, dequant_timings = measure_dequant_rows(progress)
    before = {o: kernels.quant_dequant_rows(o) for o in dequant_rows}
    for o, r in dequant_rows.items():
        kernels.set_quant_dequant_rows(o, r)
    try:
        timings = measure_int8_rows(progress)
    finally:
        restore_dequant_rows(before)
    rows_by_width = {bits: threshold(timings, formats) for bits, formats in WIDTH_FORMATS.items()}
    return Int8Rows(
        rows_by_width, timings, time.perf_counter() - start, tuning_key(), dequant_rows, dequant_timings
    )


def measure_int8_rows(progress: Callable[[str], None] | None = None) -> list[PathTiming]:
    """Both paths' timings for each format, shape and row step: the int8 path against the other (tile or
    dequantized-tile, as the kernel's thresholds stand)."""
    timings: list[PathTiming] = []
    for qtype, shape in itertools.product(itertools.chain(*WIDTH_FORMATS.values()), SHAPES):
        n, k = SHAPES[shape]
        ring = itertools.cycle(copies_past_cache(random_weight(qtype, n, k)))
        for rows in ROW_STEPS:
            x, out = torch.randn(rows, k), torch.empty(rows, n)

            def path(int8_rows: int, x=x, out=out, ring=ring) -> Callable[[], None]:
                return lambda: kernels.quant_gemm(x, next(ring), out, int8_rows=int8_rows)

            int8_s, tile_s, ratio = alternating_medians(path(rows), path(0), PAIRS)
            if ratio > 1.0:  # a verdict against the int8 path is timed twice: see best_of_two
                int8_s, tile_s, ratio = best_of_two(
                    (int8_s, tile_s), alternating_medians(path(rows), path(0), PAIRS)
                )
            timings.append(PathTiming(qtype, shape, rows, round(int8_s * 1e3, 3), round(tile_s * 1e3, 3)))
            if progress is not None:
                progress(f"{qtype:5s} {shape:5s} {rows:4d} rows: int8 path {ratio:.2f}x the tile path's time")
            if ratio > CLEARLY_SLOWER:
                break
        del ring
    return timings


def tuning_key() -> dict:
    """What a measured choice depends on: the CPU, the kernels' build and the level they run at."""
    return {"cpu": cpu_identity().key(), "kernels": kernels.source_digest(), "kernel_level": kernels.level()}


def cached_path() -> Path:
    digest = hashlib.sha256(json.dumps(tuning_key(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "int8-rows" / f"{digest}.json"


def load_or_measure(again: bool = False, progress: Callable[[str], None] | None = None) -> Int8Rows:
    """This machine's cached choice, else (or with `again`) a new measurement, cached. Processes starting
    together wait for one measurement (a file lock) rather than time the paths against each other."""
    path = cached_path()
    with contextlib.ExitStack() as stack:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context(open(path.with_suffix(".lock"), "w"))
        except OSError as exc:  # e.g. a read-only cache folder: time the paths for this process alone
            logger.warning("cannot keep quant_gemm's thresholds in %s (%s): timed for now", path, exc)
            return measure(progress)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and not again:
            try:
                return Int8Rows.from_json(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("ignoring an unreadable int8-path threshold file %s (%s)", path, exc)
        logger.warning(
            "timing quant_gemm's paths on this CPU to choose its thresholds (once per machine "
            "and kernel build, seconds; %s=builtin keeps the kernel's table)",
            ENV,
        )
        tuned = measure(progress)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(tuned.to_json(), indent=1))
            tmp.replace(path)
        except OSError as exc:
            logger.warning("cannot keep quant_gemm's thresholds in %s (%s): timed for now", path, exc)
        return tuned


_lock = threading.Lock()
_applied: dict[str, dict[int, int] | None] = {}


def apply() -> dict[int, int] | None:
    """Set this machine's measured thresholds in the kernel (timing them first where none are cached), once
    per process; the thresholds set, or None where the kernel's own stand (`SARATHI_INT8_ROWS=builtin`, the
    "vnni" and "avx512bw" levels, no quantized kernels)."""
    with _lock:
        if "rows" in _applied:
            return _applied["rows"]
        choice = os.environ.get(ENV, "measured")
        if choice not in ("measured", "builtin"):
            raise ValueError(f"{ENV} must be 'measured' (the default) or 'builtin', not {choice!r}")
        rows = None
        if choice == "measured" and kernels.level() in ("full", "avx2"):
            try:
                tuned = load_or_measure()
                rows = tuned.rows
            except Exception as exc:  # a failed timing must not keep a model from loading
                logger.warning("timing quant_gemm's paths failed (%s): the kernel's table stands", exc)
            else:
                for bits, r in rows.items():
                    kernels.set_quant_int8_rows(bits, r)
                if DEQUANT_ENV not in os.environ:  # a measurement's own setting stands
                    for offsets, r in tuned.dequant_rows.items():
                        kernels.set_quant_dequant_rows(offsets, r)
                logger.info(
                    "quant_gemm's int8 path up to %s rows (by code width), dequantized tiles from %s rows "
                    "(without offsets, with; -1: the kernel's own): measured here",
                    rows,
                    [tuned.dequant_rows.get(o, -1) for o in (False, True)],
                )
        _applied["rows"] = rows
        return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--again", action="store_true", help="time both paths again, replacing the kept choice")
    args = p.parse_args()
    if kernels.level() not in ("full", "avx2"):
        print(f"nothing to time at kernel level {kernels.level()!r}")
        return 0
    tuned = load_or_measure(again=args.again, progress=print)
    ratios: dict[tuple[str, int], list[float]] = {}
    for t in tuned.timings:
        ratios.setdefault((t.format, t.rows), []).append(t.int8_ms / t.tile_ms)
    print(f"{cpu_identity().label()}, kernel level {kernels.level()}; timed in {tuned.seconds:.1f} s")
    print("int8 path / tile path, time (mean over shapes):")
    print("format " + "".join(f"{r:>7d}" for r in ROW_STEPS))
    for qtype in itertools.chain(*WIDTH_FORMATS.values()):
        cells = [ratios.get((qtype, r)) for r in ROW_STEPS]
        print(f"{qtype:6s} " + "".join(f"{statistics.mean(c):7.2f}" if c else "      -" for c in cells))
    builtin = {b: kernels.quant_int8_rows_builtin(b) for b in WIDTH_FORMATS}
    print(f"thresholds by code width: {tuned.rows} (the kernel's table: {builtin})")
    if tuned.dequant_timings:
        dq: dict[tuple[str, int], list[float]] = {}
        for t in tuned.dequant_timings:
            dq.setdefault((t.format, t.rows), []).append(t.dequant_ms / t.tile_ms)
        steps = sorted(DEQUANT_STEPS)
        print("dequantized-tile path / tile path, time (mean over shapes):")
        print("format " + "".join(f"{r:>7d}" for r in steps))
        for qtype in itertools.chain(*dequant_kinds().values()):
            cells = [dq.get((qtype, r)) for r in steps]
            print(f"{qtype:6s} " + "".join(f"{statistics.mean(c):7.2f}" if c else "      -" for c in cells))
        own = {o: kernels.quant_dequant_rows_builtin(o) for o in (False, True)}
        print(
            f"dequantized tiles from rows, without offsets / with: {tuned.dequant_rows.get(False, -1)} / "
            f"{tuned.dequant_rows.get(True, -1)} (-1: the kernel's own, {own[False]} / {own[True]})"
        )
    print(f"kept in {cached_path()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
