"""``sarathi tune``: the token budget (and cap on running requests) with the highest simulated capacity
under a TBT SLO (and optionally a TTFT SLO), on this machine's measured profile or a simulated GPU.

Capacity is the highest QPS whose P99 TBT meets ``--tbt-slo``, whose median scheduling delay is at most
``--max-scheduling-delay`` and, with ``--ttft-slo``, whose P99 TTFT meets that. A budget whose mixed
iteration (a full chunk beside the decodes running at its capacity) is predicted to break ``--tbt-slo`` is
never chosen; where none meets the SLO, the output says so and names the closest. Writes ``tune.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from sarathi.benchmark.bench_cli import add_workload_args, csv_list, workload_config_from_args
from sarathi.benchmark.capacity import (
    DEFAULT_MAX_SCHEDULING_DELAY,
    CapacityResult,
    Probe,
    SearchSettings,
    Slo,
)
from sarathi.config import EngineConfig
from sarathi.entrypoints.args import add_engine_args, engine_config_from_args
from sarathi.simulator.latency_model import LatencyModel
from sarathi.simulator.mixed_iteration import LIGHTEST, LoadShape, mixed_iteration_time
from sarathi.simulator.simulate_cli import add_simulation_args, resolve_simulation, simulate_one
from sarathi.simulator.tune import DEFAULT_BUDGETS, Candidate, TuneResult, tune


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "tune",
        help="choose the token budget for a TBT SLO by simulated capacity",
        description=__doc__,
        conflict_handler="resolve",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_args(p)
    p.add_argument("--tbt-slo", type=float, required=True, help="P99 time between tokens, seconds")
    p.add_argument("--ttft-slo", type=float, default=None, help="P99 time to first token, seconds")
    p.add_argument("--max-scheduling-delay", type=float, default=DEFAULT_MAX_SCHEDULING_DELAY)
    p.add_argument("--budgets", type=csv_list(int), default=list(DEFAULT_BUDGETS), help="candidates")
    p.add_argument(
        "--max-num-seqs-candidates", type=csv_list(int), default=None, help="default: --max-num-seqs"
    )
    p.add_argument("--qps-start", type=float, default=1.0, help="where the capacity search starts")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    add_workload_args(p)
    add_simulation_args(p)
    p.add_argument("--output-dir", default="tune_results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run, num_requests=256)
    return p


def tune_config(
    sim_config: EngineConfig,
    model: LatencyModel,
    workload,
    slo: Slo,
    budgets,
    max_num_seqs_list,
    num_replicas: int = 1,
    router: str = "round_robin",
    qps_start: float = 1.0,
    report=None,
    settings: SearchSettings | None = None,
) -> TuneResult:
    """Simulated capacity of every (budget, max_num_seqs) of ``sim_config``; see ``tune``."""
    candidates = [Candidate(b, m) for m in max_num_seqs_list for b in budgets]
    loads: dict[tuple[Candidate, float], LoadShape] = {}
    block_size = sim_config.cache.block_size

    def measure(c: Candidate, qps: float) -> Probe:
        sched = dataclasses.replace(
            sim_config.scheduler, token_budget=c.token_budget, max_num_seqs=c.max_num_seqs
        )
        config = dataclasses.replace(sim_config, scheduler=sched)
        store = simulate_one(config, model, dataclasses.replace(workload, qps=qps), num_replicas, router)
        loads[c, qps] = LoadShape.of_store(store, block_size)
        s = store.summary()
        return Probe(qps, s["tbt_p99"], s["scheduling_delay_p50"], s["ttft_p99"])

    def mixed(c: Candidate, capacity: CapacityResult | None) -> float:
        load = LIGHTEST
        if capacity is not None and capacity.probes:
            # At the capacity, or at the lightest load probed where no load met the SLO.
            qps = capacity.capacity or min(p.qps for p in capacity.probes)
            load = loads.get((c, qps), LIGHTEST)
        return mixed_iteration_time(model, c.token_budget, load)

    if settings is None:
        settings = SearchSettings(qps_start=qps_start, qps_min=0.01, qps_max=1e4, rel_tol=0.05, max_probes=16)
    return tune(candidates, measure, slo, settings, on_candidate=report, mixed_iteration=mixed)


def run(args: argparse.Namespace) -> int:
    try:
        if args.tbt_slo <= 0:
            raise ValueError(f"--tbt-slo must be > 0 seconds, got {args.tbt_slo}")
        slo = Slo(f"{args.tbt_slo * 1e3:g}ms", args.tbt_slo, args.max_scheduling_delay, args.ttft_slo)
        workload = workload_config_from_args(args, 1.0)
        config = engine_config_from_args(args)
        sim_config, model = resolve_simulation(args, config)
        budgets = sorted(set(args.budgets))
        if not budgets or min(budgets) < 1:
            raise ValueError(f"--budgets must be positive integers, got {args.budgets}")
        seqs = sorted(set(args.max_num_seqs_candidates or [config.scheduler.max_num_seqs]))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def report(c: Candidate, r) -> None:
        if not args.no_progress:
            print(
                f"  budget {c.token_budget:>5}  max_num_seqs {c.max_num_seqs:>4}: "
                f"capacity {r.capacity:.3g} QPS ({len(r.probes)} simulated probes)",
                file=sys.stderr,
            )

    result = tune_config(
        sim_config,
        model,
        workload,
        slo,
        budgets,
        seqs,
        args.num_replicas,
        args.router,
        args.qps_start,
        report,
    )
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        **result.to_json(),
        "workload": dataclasses.asdict(workload),
        "scheduler": config.scheduler.name,
    }
    (out / "tune.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(format_result(result))
    print(f"wrote {out / 'tune.json'}")
    return 0


def format_result(result: TuneResult) -> str:
    lines = [f"{'token budget':>12}{'max seqs':>10}{'capacity (QPS)':>16}{'mixed iter (ms)':>17}"]
    for c, r in result.capacities.items():
        mark = "  <- chosen" if c == result.best else ""
        mixed = result.mixed_iteration_s.get(c)
        mixed_text = "-" if mixed is None else f"{mixed * 1e3:.0f}"
        lines.append(f"{c.token_budget:>12}{c.max_num_seqs:>10}{r.capacity:>16.3g}{mixed_text:>17}{mark}")
    slo = result.slo
    ttft = f", P99 TTFT <= {slo.ttft_p99:g} s" if slo.ttft_p99 is not None else ""
    if result.meets_slo:
        lines.append(
            f"chosen: --token-budget {result.best.token_budget} --max-num-seqs {result.best.max_num_seqs} "
            f"(predicted capacity {result.best_capacity:.3g} QPS at P99 TBT <= {slo.tbt_p99:g} s{ttft})"
        )
    else:
        mixed = result.mixed_iteration_s.get(result.best)
        closest = f"; its mixed iteration is predicted at {mixed * 1e3:.0f} ms" if mixed is not None else ""
        lines.append(
            f"NO token budget meets P99 TBT <= {slo.tbt_p99:g} s{ttft} on this machine; closest: "
            f"--token-budget {result.best.token_budget} --max-num-seqs {result.best.max_num_seqs}{closest}"
        )
    return "\n".join(lines)
