"""The quantized GEMM kernel alone: one linear layer's product, timed in a loop, against the dense path.

For each GGUF format and each number of rows of x, the median time of one call, cycling over copies of the
weight that together exceed any last-level cache (one weight of these shapes fits a 32 MiB L3), the quantized
bytes read per second (beside it, the same call on one weight again and again, in cache where it fits, not
the LM head's: far above the memory's rate means the loop waits on memory), and the ratio to the
dense kernel on the same shape: our bf16 GEMM where AVX512-BF16 exists, PyTorch's float32 linear elsewhere
(the AVX2 build). Few rows take the int8-activation path
(VPDPBUSD, or VPMADDUBSW on AVX2), more rows the dequantized-tile one; `--both-paths` also times each
path forced at every row count, alternating the two calls (the way `sarathi/model/quant_path_tuning.py`
chooses each code width's threshold on the machine, `kernels.quant_int8_rows`; the default calls use it).
Shapes are Llama 3.2 1B's (`--shape`): the MLP's up projection (8,192 x 2,048), its down projection
(2,048 x 8,192) and the tied LM head (128,256 x 2,048). Random codes; results saved with the machine:

    python -m benchmarks.quant_kernel [--formats Q8_0,Q4_K,Q6_K] [--rows 1,4,8,32] [--both-paths]
    python -m benchmarks.quant_kernel --thresholds   # the timing behind quant_int8_rows, saved
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
import time
from collections.abc import Callable

import torch

from benchmarks.record import save_result
from sarathi.model import kernels, quant_path_tuning
from sarathi.model.quant_path_tuning import alternating_medians, copies_past_cache, random_weight

SHAPES = {"up": (8192, 2048), "down": (2048, 8192), "lm_head": (128256, 2048)}


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def save_thresholds() -> int:
    """`quant_path_tuning.measure` once more (the kept choice is left as it is), saved as a record."""
    tuned = quant_path_tuning.measure(progress=print)
    builtin = {b: kernels.quant_int8_rows_builtin(b) for b in quant_path_tuning.WIDTH_FORMATS}
    print(f"thresholds by code width: {tuned.rows} (the kernel's table: {builtin}), {tuned.seconds:.1f} s")
    rows = [dataclasses.asdict(t) for t in tuned.timings]
    settings = {"thresholds": tuned.rows, "builtin": builtin, "seconds": round(tuned.seconds, 1)}
    print(f"saved {save_result('quant_path_tuning', rows, settings)}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", default="Q8_0,Q4_0,Q4_K,Q6_K")
    p.add_argument("--rows", default="1,2,4,8,32")
    p.add_argument("--shape", default="up,down,lm_head")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--both-paths", action="store_true", help="also time the int8 and tile paths at every row count"
    )
    p.add_argument(
        "--thresholds",
        action="store_true",
        help="only time the two paths the way a first quantized model load does, and save that record",
    )
    args = p.parse_args()
    if not kernels.portable_available():
        print("sarathi's CPU kernels do not run here", file=sys.stderr)
        return 1
    if args.thresholds:
        return save_thresholds()
    quant_path_tuning.apply()  # the thresholds a loaded model would run with
    # Without AVX512-BF16 the dense path is PyTorch's float32 linear: the quantized kernel is compared to it.
    dense_name = "bf16" if kernels.available() else "fp32"
    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    for shape in args.shape.split(","):
        n, k = SHAPES[shape]
        dense_weight = torch.randn(n, k) * 0.02
        if dense_name == "bf16":
            packed = kernels.pack(dense_weight)

            def dense(x: torch.Tensor, packed=packed, n=n) -> torch.Tensor:
                return kernels.gemm(x, packed, n, None)
        else:

            def dense(x: torch.Tensor, w=dense_weight) -> torch.Tensor:
                return torch.nn.functional.linear(x, w)

        repeats = max(3, args.repeats // 8) if shape == "lm_head" else args.repeats
        dense_s = {}
        for m in rows_list:
            x = torch.randn(m, k)
            dense_s[m] = median_seconds(lambda x=x, dense=dense: dense(x), repeats)
        for qtype in args.formats.split(","):
            w = random_weight(qtype, n, k)
            ring = itertools.cycle(copies_past_cache(w))
            for m in rows_list:
                x = torch.randn(m, k)
                out = torch.empty(m, n)

                def call(x=x, out=out, ring=ring) -> None:
                    kernels.quant_gemm(x, next(ring), out)

                s = median_seconds(call, repeats)
                hot = median_seconds(lambda x=x, out=out, w=w: kernels.quant_gemm(x, w, out), repeats)
                row = {
                    "shape": shape,
                    "n": n,
                    "k": k,
                    "format": qtype,
                    "rows": m,
                    "ms": round(s * 1e3, 3),
                    "quantized_gb_per_s": round(w.nbytes / s / 1e9, 1),
                    "hot_ms": round(hot * 1e3, 3),
                    "hot_gb_per_s": round(w.nbytes / hot / 1e9, 1),
                    "dense": dense_name,
                    "dense_ms": round(dense_s[m] * 1e3, 3),
                    "vs_dense": round(s / dense_s[m], 2),
                }
                line = (
                    f"{shape:8s} {qtype:5s} rows {m:3d}: {row['ms']:8.3f} ms  "
                    f"{row['quantized_gb_per_s']:5.1f} GB/s (in cache {row['hot_gb_per_s']:5.1f})  "
                    f"{dense_name} {row['dense_ms']:8.3f} ms  "
                    f"({row['vs_dense']:.2f}x)"
                )
                if args.both_paths:

                    def forced(int8_rows: int, x=x, out=out, ring=ring) -> Callable[[], None]:
                        return lambda: kernels.quant_gemm(x, next(ring), out, int8_rows=int8_rows)

                    int8_s, tile_s, ratio = alternating_medians(forced(m), forced(0), repeats)
                    row |= {"int8_ms": round(int8_s * 1e3, 3), "tile_ms": round(tile_s * 1e3, 3)}
                    row["int8_vs_tile"] = round(ratio, 2)
                    line += f"  int8 path {int8_s * 1e3:.3f} / tile path {tile_s * 1e3:.3f} ms = {ratio:.2f}"
                results.append(row)
                print(line, flush=True)
    settings = vars(args) | {"int8_rows": {b: kernels.quant_int8_rows(b) for b in (4, 5, 6, 8)}}
    print(f"saved {save_result('quant_kernel', results, settings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
