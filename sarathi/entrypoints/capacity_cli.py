"""``sarathi capacity``: per scheduler, the highest QPS with P99 TBT within an SLO and median scheduling
delay within a bound, by bisection on QPS (in-process runs of the workload).

SLOs are given in seconds (``--slo``) and/or, like the paper, as multiples of a measured decode-only
iteration time (``--slo-multiple 5,25`` for strict and relaxed). Writes ``capacity.json``, one folder of
bench results per probe, ``capacity_bars.png`` and, with several SLOs, ``capacity_vs_slo.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sarathi.benchmark.bench import bench_configs, run_one_in_process
from sarathi.benchmark.capacity import (
    DEFAULT_MAX_SCHEDULING_DELAY,
    Probe,
    SearchSettings,
    find_capacity,
    resolve_slos,
)
from sarathi.benchmark.metrics_store import json_safe
from sarathi.entrypoints.build import build_engine
from sarathi.entrypoints.workload_args import (
    add_comparison_parser,
    add_workload_args,
    csv_list,
    engine_config_for,
    workload_config_from_args,
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = add_comparison_parser(
        sub,
        "capacity",
        "highest QPS per scheduler within a TBT SLO (bisection)",
        __doc__,
        ["sarathi", "vllm"],
    )
    add_workload_args(p)
    s = p.add_argument_group("SLO and search")
    s.add_argument(
        "--slo", type=csv_list(float), default=[], help="P99 TBT SLO(s) in seconds, comma-separated"
    )
    s.add_argument(
        "--slo-multiple",
        type=csv_list(float),
        default=[],
        help="SLO(s) as multiples of a decode iteration, e.g. 5,25",
    )
    s.add_argument(
        "--decode-time", type=float, default=None, help="decode iteration seconds (skip measuring)"
    )
    s.add_argument("--decode-batch-size", type=int, default=8, help="batch of the measured decode iteration")
    s.add_argument(
        "--decode-context-len", type=int, default=512, help="context of the measured decode iteration"
    )
    s.add_argument("--max-scheduling-delay", type=float, default=DEFAULT_MAX_SCHEDULING_DELAY)
    s.add_argument("--qps-start", type=float, default=1.0)
    s.add_argument("--qps-min", type=float, default=0.05)
    s.add_argument("--qps-max", type=float, default=64.0)
    s.add_argument(
        "--tolerance", type=float, default=0.1, help="stop when the bracket is this narrow (relative)"
    )
    s.add_argument("--max-probes", type=int, default=8, help="runs per scheduler and SLO at most")
    p.add_argument("--output-dir", default="capacity_results")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)
    return p


def measure_decode_time(engine, batch_size: int, context_len: int) -> float:
    from sarathi.benchmark.profiler import measure_decode_iteration_time

    return measure_decode_iteration_time(engine, batch_size, context_len)


def run(args: argparse.Namespace) -> int:
    try:
        settings = SearchSettings(args.qps_start, args.qps_min, args.qps_max, args.tolerance, args.max_probes)
        configs = bench_configs(args.schedulers, args.token_budget)
        engine_configs = [engine_config_for(args, c) for c in configs]
        workload_config_from_args(args, settings.qps_start)  # validates the workload flags
        if not args.slo and not args.slo_multiple:
            raise ValueError("give --slo SECONDS and/or --slo-multiple N")
        if args.decode_time is not None and args.decode_time <= 0:
            raise ValueError(f"--decode-time must be > 0, got {args.decode_time}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    decode_time = args.decode_time
    results: dict[str, dict[str, dict]] = {}
    try:
        for config, ec in zip(configs, engine_configs, strict=True):
            engine = build_engine(ec)
            if args.slo_multiple and decode_time is None:
                decode_time = measure_decode_time(engine, args.decode_batch_size, args.decode_context_len)
                print(
                    f"decode iteration ({args.decode_batch_size} x {args.decode_context_len}): "
                    f"{decode_time * 1e3:.1f} ms",
                    file=sys.stderr,
                )
            slos = resolve_slos(args.slo, args.slo_multiple, decode_time, args.max_scheduling_delay)
            probes: dict[float, Probe] = {}

            def measure(qps, config=config, ec=ec, engine=engine, probes=probes):
                if qps not in probes:
                    run = run_one_in_process(
                        ec, workload_config_from_args(args, qps), config, engine, not args.no_progress
                    )
                    run.store.write(
                        out / "probes" / f"{config.label}-qps{qps:.4g}", extra_summary=run.summary
                    )
                    s = run.summary
                    probes[qps] = Probe(qps, s["tbt_p99"], s["scheduling_delay_p50"])
                    print(
                        f"{config.label} qps {qps:.3g}: TBT p99 {s['tbt_p99'] * 1e3:.0f} ms, "
                        f"sched p50 {s['scheduling_delay_p50']:.2f} s",
                        file=sys.stderr,
                    )
                return probes[qps]

            try:
                for slo in slos:
                    r = find_capacity(measure, slo, settings)
                    results.setdefault(slo.label, {})[config.label] = {
                        "slo_tbt_p99": slo.tbt_p99,
                        "max_scheduling_delay": slo.max_scheduling_delay,
                        "capacity_qps": r.capacity,
                        "lowest_failing_qps": r.lowest_failing_qps,
                        "probes": [vars(p) | {"meets": p.meets(slo)} for p in r.probes],
                    }
            finally:
                engine.shutdown()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _write(out, results, decode_time)
    return 0


def _write(out: Path, results: dict[str, dict[str, dict]], decode_time: float | None) -> None:
    from sarathi.benchmark.plots import plot_capacity_bars, plot_capacity_vs_slo

    (out / "capacity.json").write_text(
        json.dumps(json_safe({"decode_iteration_time": decode_time, "slos": results}), indent=2) + "\n"
    )
    bars = {slo: {k: v["capacity_qps"] for k, v in per.items()} for slo, per in results.items()}
    plot_capacity_bars(bars, out / "capacity_bars.png")
    if len(results) > 1:
        labels = list(results)
        secs = [next(iter(results[s].values()))["slo_tbt_p99"] for s in labels]
        curves = {c: [results[s][c]["capacity_qps"] for s in labels] for c in results[labels[0]]}
        plot_capacity_vs_slo(secs, curves, out / "capacity_vs_slo.png")
    print(f"{'SLO':<22}" + "".join(f"{c:>18}" for c in next(iter(results.values()))))
    for slo, per in results.items():
        print(f"{slo:<22}" + "".join(f"{v['capacity_qps']:>14.3f} QPS" for v in per.values()))
    print(f"wrote {out / 'capacity.json'}")
