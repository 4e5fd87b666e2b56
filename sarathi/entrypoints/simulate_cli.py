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

from sarathi.benchmark.bench import BenchRun, bench_configs, format_table, summary_entry, write_results
from sarathi.config import EngineConfig
from sarathi.core.latency_model import LatencyModel
from sarathi.entrypoints.bench_cli import (
    add_comparison_parser,
    add_workload_args,
    engine_config_for,
    workload_config_from_args,
)
from sarathi.simulator.cluster import ROUTERS, simulate_one, simulation_config


def add_simulation_args(p: argparse.ArgumentParser) -> None:
    """Latency-model and cluster flags shared by ``simulate`` and ``tune``."""
    g = p.add_argument_group("simulation")
    g.add_argument(
        "--profile",
        default=None,
        help="latency model JSON from `sarathi profile` (default: this machine's cached profile)",
    )
    g.add_argument("--hardware", default=None, help="simulate a GPU instead (e.g. a100, h100)")
    g.add_argument(
        "--model-spec", default=None, help="with --hardware: a paper model (e.g. yi-34b) or a config.json"
    )
    g.add_argument(
        "--gpus-per-node", type=int, default=None, help="with --hardware: GPUs per node (default 8)"
    )
    g.add_argument("--num-replicas", type=int, default=1, help="engines behind the router")
    g.add_argument("--router", default="round_robin", choices=ROUTERS)


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


def resolve_simulation(args: argparse.Namespace, config: EngineConfig) -> tuple[EngineConfig, LatencyModel]:
    """The weight-free engine config and the latency model the flags ask for (ValueError names a problem)."""
    if args.num_replicas < 1:
        raise ValueError(f"--num-replicas must be >= 1, got {args.num_replicas}")
    if args.hardware or args.model_spec:
        if not (args.hardware and args.model_spec):
            raise ValueError("--hardware and --model-spec go together")
        from sarathi.simulator.gpu import gpu_simulation

        return gpu_simulation(config, args.model_spec, args.hardware, args.gpus_per_node)
    from sarathi.simulator.measured import MeasuredLatencyModel

    sim_config = simulation_config(config)
    if args.profile:
        model = MeasuredLatencyModel.load(args.profile)
    else:
        from sarathi.simulator.machine_profile import machine_latency_model

        model = machine_latency_model(config, progress=not getattr(args, "no_progress", False))
    pp = config.parallel.pipeline_parallel_size
    if model.num_stages != pp:
        raise ValueError(f"the latency profile has {model.num_stages} pipeline stages, the config {pp}")
    return sim_config, model


def run(args: argparse.Namespace) -> int:
    try:
        qps = None if args.qps == 0 else args.qps
        workload = workload_config_from_args(args, qps)
        configs = bench_configs(args.schedulers, args.token_budget)
        engine_configs = [engine_config_for(args, c) for c in configs]
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
