"""``sarathi profile``: iteration latency over a (prefill tokens, decode batch size, context) grid.

Writes ``profile.csv``, ``profile.png`` and ``latency_model.json`` (the fitted latency model the simulator
reads, with its held-out error) to ``--output-dir`` and prints one table per context length.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sarathi.entrypoints.args import add_engine_args, engine_config_from_args

DEFAULT_PREFILL_TOKENS = "0,16,64,128,256,512"
DEFAULT_DECODE_BATCH_SIZES = "0,1,2,4,8,16,32"
DEFAULT_CONTEXT_LENS = "128,512,1024"


def add_parser(sub) -> argparse.ArgumentParser:
    prof = sub.add_parser("profile", help="measure iteration latency over a grid of batch shapes")
    prof.add_argument(
        "--prefill-tokens", default=DEFAULT_PREFILL_TOKENS, help="comma list: tokens of the prefill chunk"
    )
    prof.add_argument(
        "--decode-batch-sizes", default=DEFAULT_DECODE_BATCH_SIZES, help="comma list: decodes per batch"
    )
    prof.add_argument(
        "--context-lens", default=DEFAULT_CONTEXT_LENS, help="comma list: cached tokens per sequence"
    )
    prof.add_argument("--repeats", type=int, default=3, help="timed iterations per grid point")
    prof.add_argument("--warmup", type=int, default=1, help="untimed iterations per grid point")
    prof.add_argument("--output-dir", default="profile_out", help="where profile.csv and profile.png go")
    prof.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(prof)
    prof.set_defaults(run=run)
    return prof


def parse_int_list(text: str, flag: str) -> list[int]:
    """``"0,16,64"`` -> ``[0, 16, 64]``; ValueError naming ``flag`` for anything but integers >= 0."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise ValueError(f"{flag} must be a comma list of integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"{flag} must be a non-empty comma list of integers >= 0, got {text!r}")
    return list(dict.fromkeys(values))


def run(args: argparse.Namespace) -> int:
    from sarathi.benchmark.profile_plots import plot_profile
    from sarathi.benchmark.profiler import check_point, grid_points, profile_grid, write_csv
    from sarathi.entrypoints.build import build_engine

    started = time.monotonic()
    try:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        if args.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
        points = grid_points(
            parse_int_list(args.prefill_tokens, "--prefill-tokens"),
            parse_int_list(args.decode_batch_sizes, "--decode-batch-sizes"),
            parse_int_list(args.context_lens, "--context-lens"),
        )
        if not points:
            raise ValueError("the grid is empty: every point has 0 prefill tokens and 0 decodes")
        engine = build_engine(engine_config_from_args(args))
        for point in points:
            check_point(engine, point)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = profile_grid(
        engine, points, repeats=args.repeats, warmup=args.warmup, progress=not args.no_progress
    )
    out = Path(args.output_dir)
    csv_path = write_csv(results, out / "profile.csv")
    png_path = plot_profile(results, out / "profile.png")
    print(format_table(results))
    print(f"{len(results)} grid points, {args.repeats} timed runs each, {time.monotonic() - started:.0f} s")
    print(f"wrote {csv_path}\nwrote {png_path}")
    model_path = _write_latency_model(engine, results, out / "latency_model.json")
    if model_path is not None:
        print(f"wrote {model_path}")
    return 0


def _write_latency_model(engine, results, path: Path) -> Path | None:
    """Fit the simulator's latency model to ``results``, print its held-out error and save it (with the
    engine's measured per-iteration overhead); None when the grid is too small to fit."""
    from sarathi.simulator.machine_profile import fit_profile

    if len(results) < 10:
        print("latency model: not fitted (needs at least 10 grid points)")
        return None
    model = fit_profile(engine, results)
    err = model.metadata["held_out_error"]
    print(
        f"latency model: held-out relative error median {err['median']:.1%}, p90 {err['p90']:.1%}, "
        f"max {err['max']:.1%} over {len(results)} points; engine overhead "
        f"{model.engine_overhead_s * 1e3:.2f} ms per iteration"
    )
    return model.save(path)


def format_table(results) -> str:
    """Median iteration time (ms) per context length: rows prefill tokens, columns decode batch size."""
    lines = []
    for c in sorted({r.context_len for r in results}):
        at_c = {(r.prefill_tokens, r.decode_batch_size): r.median_ms for r in results if r.context_len == c}
        ps = sorted({p for p, _ in at_c})
        ds = sorted({d for _, d in at_c})
        lines.append(f"context {c}: median ms (rows: prefill tokens, columns: decode batch size)")
        lines.append("P / D".rjust(7) + "".join(f"{d:>9}" for d in ds))
        for p in ps:
            cells = "".join(f"{at_c[p, d]:>9.1f}" if (p, d) in at_c else f"{'-':>9}" for d in ds)
            lines.append(f"{p:>7}" + cells)
    return "\n".join(lines)
