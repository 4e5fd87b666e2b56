"""Does ``sarathi tune`` pick the right budget, and does the adaptive budget beat the best fixed one?

On this machine, for one workload and TBT SLO:
1. ``tune`` (simulated capacity on the machine's cached latency profile) over the candidate budgets;
2. the real capacity of every candidate (in-process engine runs, the same bisection, started at the
   simulated capacity), i.e. the brute-force sweep;
3. the adaptive budget (``--adaptive-budget``, capped at the largest candidate): simulated and real capacity.
Prints simulated vs real capacity per budget, whether the tuned budget's real capacity is within 10% of the
best real one, and saves the rows with machine and commit. Run it on a quiet machine:

    .venv/bin/python -m benchmarks.tune_check
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks.record import save_result
from sarathi.benchmark.capacity import Probe, SearchSettings, Slo, find_capacity
from sarathi.benchmark.runner import run_in_process, warm_up
from sarathi.benchmark.workload import TokenSpace, WorkloadConfig, generate_workload
from sarathi.config import engine_config
from sarathi.entrypoints.build import build_engine
from sarathi.simulator.cluster import simulate_one, simulation_config
from sarathi.simulator.machine_profile import machine_latency_model
from sarathi.simulator.tune import format_result, tune_config


def real_capacity(config, workload: WorkloadConfig, slo: Slo, settings: SearchSettings) -> tuple[float, list]:
    engine = build_engine(config)
    try:
        space = TokenSpace.of_engine(engine)

        def measure(qps: float) -> Probe:
            requests = generate_workload(dataclasses.replace(workload, qps=qps), space)
            warm_up(engine, requests[0].prompt_token_ids[:32])
            s = run_in_process(engine, requests).summary()
            print(
                f"    real probe {qps:.3g} QPS: P99 TBT {s['tbt_p99'] * 1e3:.0f} ms, "
                f"sched p50 {s['scheduling_delay_p50']:.2f} s",
                flush=True,
            )
            return Probe(qps, s["tbt_p99"], s["scheduling_delay_p50"])

        result = find_capacity(measure, slo, settings)
        return result.capacity, [dataclasses.asdict(p) for p in result.probes]
    finally:
        engine.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="32,64,128,256")
    p.add_argument("--tbt-slo", type=float, default=0.2)
    p.add_argument("--trace", default="arxiv")
    p.add_argument("--length-scale", type=float, default=0.125)
    p.add_argument("--max-total-tokens", type=int, default=1024)
    p.add_argument("--num-requests", type=int, default=24, help="requests per real probe")
    p.add_argument("--max-probes", type=int, default=4, help="real probes per capacity search")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    slo = Slo(f"{args.tbt_slo * 1e3:g}ms", args.tbt_slo)
    workload = WorkloadConfig(
        trace=args.trace,
        num_requests=args.num_requests,
        length_scale=args.length_scale,
        max_total_tokens=args.max_total_tokens,
        seed=0,
    )
    base = engine_config(token_budget=budgets[0])
    model = machine_latency_model(base)
    sim_config = simulation_config(base)
    started = time.monotonic()
    # Simulated with more requests than a real probe: the simulator is cheap and its estimate steadier.
    sim_workload = dataclasses.replace(workload, num_requests=max(200, args.num_requests))
    tuned = tune_config(sim_config, model, sim_workload, slo, budgets, [base.scheduler.max_num_seqs])
    print(format_result(tuned), flush=True)
    rows = []
    for candidate, sim in tuned.capacities.items():
        config = engine_config(token_budget=candidate.token_budget)
        settings = SearchSettings(
            qps_start=max(sim.capacity, 0.05), qps_min=0.02, rel_tol=0.1, max_probes=args.max_probes
        )
        print(f"budget {candidate.token_budget}: simulated capacity {sim.capacity:.3g} QPS; real search:")
        real, probes = real_capacity(config, workload, slo, settings)
        rows.append(
            {
                "budget": candidate.token_budget,
                "adaptive": False,
                "sim_capacity_qps": sim.capacity,
                "real_capacity_qps": real,
                "real_probes": probes,
            }
        )
    cap = max(budgets)
    adaptive = engine_config(token_budget=cap, adaptive_tbt_slo=args.tbt_slo)
    sim_adaptive = find_capacity(
        lambda qps: _sim_probe(simulation_config(adaptive), model, sim_workload, qps),
        slo,
        SearchSettings(qps_start=1.0, qps_min=0.02, qps_max=1e4, rel_tol=0.05, max_probes=16),
    ).capacity
    print(f"adaptive (cap {cap}): simulated capacity {sim_adaptive:.3g} QPS; real search:")
    real, probes = real_capacity(
        adaptive,
        workload,
        slo,
        SearchSettings(
            qps_start=max(sim_adaptive, 0.05), qps_min=0.02, rel_tol=0.1, max_probes=args.max_probes
        ),
    )
    rows.append(
        {
            "budget": cap,
            "adaptive": True,
            "sim_capacity_qps": sim_adaptive,
            "real_capacity_qps": real,
            "real_probes": probes,
        }
    )
    fixed = [r for r in rows if not r["adaptive"]]
    best = max(fixed, key=lambda r: r["real_capacity_qps"])
    chosen = next(r for r in fixed if r["budget"] == tuned.best.token_budget)
    ratio = (
        chosen["real_capacity_qps"] / best["real_capacity_qps"] if best["real_capacity_qps"] else float("nan")
    )
    print("\n|budget|simulated capacity (QPS)|real capacity (QPS)|")
    print("|---|---|---|")
    for r in rows:
        name = f"adaptive (cap {r['budget']})" if r["adaptive"] else str(r["budget"])
        mark = " (tuned)" if not r["adaptive"] and r["budget"] == tuned.best.token_budget else ""
        print(f"|{name}{mark}|{r['sim_capacity_qps']:.3g}|{r['real_capacity_qps']:.3g}|")
    print(
        f"tuned budget {tuned.best.token_budget}: real capacity {ratio:.0%} of the best fixed budget "
        f"({best['budget']}); {time.monotonic() - started:.0f} s"
    )
    if not args.no_save:
        summary = {
            "tuned_budget": tuned.best.token_budget,
            "best_real_budget": best["budget"],
            "tuned_over_best": ratio,
        }
        print(f"saved {save_result('tune-check', rows, {**vars(args), **summary})}")
    return 0


def _sim_probe(config, model, workload, qps) -> Probe:
    s = simulate_one(config, model, dataclasses.replace(workload, qps=qps)).summary()
    return Probe(qps, s["tbt_p99"], s["scheduling_delay_p50"])


if __name__ == "__main__":
    raise SystemExit(main())
