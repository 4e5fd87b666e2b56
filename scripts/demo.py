"""``make demo``: stall-free batching vs the baselines, measured under load on the embedded SmolLM2-135M.

ShareGPT request lengths (scaled down so the run fits a small CPU) arrive as a Poisson process at a rate
where new prompts keep arriving while earlier requests decode. Every scheduler sees the same requests at
the same times, in-process. Prefill-first schedulers (vllm, orca) stall every running decode for whole
prompts, which shows as a long tail of time-between-tokens; faster_transformer never mixes prompts into a
running batch, so requests wait long to be scheduled; sarathi chunks prompts under the token budget and
keeps decodes going. Prints the table and writes summary.json, CSVs and plots to ``--output-dir``.

The load is calibrated to the machine: unless ``--qps`` is given, the demo takes this machine's latency
profile (measured once and cached, as ``sarathi simulate`` does), finds sarathi's capacity on the demo's
workload in simulation (P99 TBT within 5x a one-sequence decode iteration, the paper's strict SLO, and
median scheduling delay <= 2 s) and runs at ``--load`` (75%) of it, so the stalls show wherever it runs.

The Figure 7 demo that ``make demo`` ran before is ``scripts/figure7.py``.
"""

from __future__ import annotations

import argparse
import sys

from sarathi.entrypoints.cli import main as sarathi_main

SCHEDULERS = "sarathi,vllm,orca,faster_transformer"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--schedulers", default=SCHEDULERS)
    parser.add_argument("--trace", default="sharegpt")
    parser.add_argument("--length-scale", type=float, default=0.15)
    parser.add_argument("--max-total-tokens", type=int, default=1024)
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--qps", type=float, default=None, help="default: --load x simulated capacity")
    parser.add_argument("--load", type=float, default=0.75, help="fraction of sarathi's capacity")
    parser.add_argument("--token-budget", default="64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--output-dir", default="demo_results")
    args = parser.parse_args()
    if args.qps is None:
        args.qps = calibrated_qps(args)
    print(
        f"{args.num_requests} {args.trace} requests (lengths x{args.length_scale:g}, at most "
        f"{args.max_total_tokens} tokens), Poisson arrivals at {args.qps:g} QPS, token budget "
        f"{args.token_budget}, SmolLM2-135M {args.dtype}; schedulers: {args.schedulers}",
        file=sys.stderr,
    )
    return sarathi_main(
        [
            "bench",
            "--schedulers",
            args.schedulers,
            "--trace",
            args.trace,
            "--length-scale",
            str(args.length_scale),
            "--max-total-tokens",
            str(args.max_total_tokens),
            "--num-requests",
            str(args.num_requests),
            "--qps",
            str(args.qps),
            "--arrival",
            "poisson",
            "--token-budget",
            args.token_budget,
            "--seed",
            str(args.seed),
            "--dtype",
            args.dtype,
            "--output-dir",
            args.output_dir,
        ]
    )


def calibrated_qps(args: argparse.Namespace) -> float:
    """``args.load`` x sarathi's simulated capacity on the demo workload on this machine."""
    import dataclasses

    from sarathi.benchmark.capacity import Probe, SearchSettings, Slo, find_capacity
    from sarathi.benchmark.workload import WorkloadConfig
    from sarathi.config import engine_config
    from sarathi.simulator.batch_shape import BatchShape
    from sarathi.simulator.cluster import simulation_config
    from sarathi.simulator.machine_profile import machine_latency_model
    from sarathi.simulator.simulate_cli import simulate_one

    config = engine_config(token_budget=int(args.token_budget), dtype=args.dtype, seed=args.seed)
    model = machine_latency_model(config)
    decode = model.iteration_time(BatchShape.from_grid(0, 1, 256))
    slo = Slo("strict", 5 * decode)
    workload = WorkloadConfig(
        trace=args.trace,
        num_requests=max(args.num_requests, 200),
        length_scale=args.length_scale,
        max_total_tokens=args.max_total_tokens,
        seed=args.seed,
    )
    sim_config = simulation_config(config)

    def measure(qps: float) -> Probe:
        s = simulate_one(sim_config, model, dataclasses.replace(workload, qps=qps)).summary()
        return Probe(qps, s["tbt_p99"], s["scheduling_delay_p50"])

    capacity = find_capacity(measure, slo, SearchSettings(qps_start=0.5, qps_min=0.02, rel_tol=0.05)).capacity
    qps = round(max(args.load * capacity, 0.05), 2)
    print(
        f"load: a one-sequence decode iteration takes {decode * 1e3:.0f} ms here; sarathi's simulated "
        f"capacity "
        f"on this workload (P99 TBT <= {slo.tbt_p99 * 1e3:.0f} ms, median scheduling delay <= 2 s) is "
        f"{capacity:.2f} QPS, so the demo runs at {args.load:.0%} of it: {qps:g} QPS",
        file=sys.stderr,
    )
    return qps


if __name__ == "__main__":
    sys.exit(main())
