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

from sarathi.benchmark.capacity import DEFAULT_MAX_SCHEDULING_DELAY, Slo
from sarathi.entrypoints.args import add_engine_args, engine_config_from_args
from sarathi.entrypoints.workload_args import (
    add_simulation_args,
    add_workload_args,
    csv_list,
    resolve_simulation,
    workload_config_from_args,
)
from sarathi.simulator.tune import DEFAULT_BUDGETS, Candidate, format_result, tune_config


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
