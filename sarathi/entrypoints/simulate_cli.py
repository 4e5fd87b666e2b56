"""``sarathi simulate``: ``sarathi bench`` in simulated time.

The same workload flags, schedulers and outputs (``summary.json``, CSVs, plots) as ``sarathi bench``; each
iteration's time comes from a latency model instead of running the model: this machine's measured profile
(``--profile``, or the cached one, profiled once if there is none), or the analytic model of a GPU
(``--hardware`` with ``--model-spec``). ``--num-replicas`` puts several engines behind a router.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sarathi.benchmark.bench import BenchRun, format_table, summary_entry, write_results
from sarathi.entrypoints.workload_args import (
    add_comparison_parser,
    add_simulation_args,
    add_workload_args,
    comparison_plan,
    resolve_simulation,
)
from sarathi.simulator.cluster import simulate_one


def add_parser(sub) -> argparse.ArgumentParser:
    p = add_comparison_parser(
        sub, "simulate", "replay a workload in simulated time (same outputs as bench)", __doc__, ["sarathi"]
    )
    p.add_argument("--qps", type=float, default=1.0, help="mean arrival rate; 0 = all at once")
    add_workload_args(p)
    add_simulation_args(p)
    p.add_argument("--output-dir", default="simulate_results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    try:
        workload, configs, engine_configs = comparison_plan(args, args.token_budget)
        resolved = [resolve_simulation(args, ec) for ec in engine_configs]
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs = []
    for config, (sim_config, model) in zip(configs, resolved, strict=True):
        started = time.monotonic()
        try:
            store = simulate_one(
                sim_config,
                model,
                workload,
                args.num_replicas,
                args.router,
                progress=not args.no_progress,
                desc=config.label,
            )
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        entry = summary_entry(config, workload, store, "simulated")
        entry["model"] = args.model_spec or args.model or "embedded SmolLM2-135M-Instruct"
        entry["hardware"] = args.hardware or "this machine (measured profile)"
        entry["dtype"] = sim_config.model.dtype
        entry["compute_dtype"] = sim_config.model.compute_dtype
        entry["tensor_parallel_size"] = sim_config.parallel.tensor_parallel_size
        entry["pipeline_parallel_size"] = sim_config.parallel.pipeline_parallel_size
        entry["num_replicas"] = args.num_replicas
        entry["router"] = args.router
        entry["simulation_seconds"] = round(time.monotonic() - started, 2)
        runs.append(BenchRun(config, store, entry))
        print(f"{config.label}: simulated in {entry['simulation_seconds']} s", file=sys.stderr)
    plots = write_results(runs, args.output_dir)
    print(format_table([r.summary for r in runs]))
    print(f"wrote {Path(args.output_dir) / 'summary.json'} and {len(plots)} plots")
    return 0
