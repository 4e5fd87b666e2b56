"""Simulator fidelity on this machine: simulated vs real (in-process) latencies for the same requests.

For each workload (arxiv and sharegpt lengths scaled to this CPU), scheduler and load, the same generated
requests run once on the real engine (in-process, as ``sarathi bench`` runs them) and once in the simulator
with this machine's measured latency profile (``sarathi profile``'s model, cached; measured first if there
is none). Loads are fractions of the sarathi scheduler's simulated saturation throughput. Prints P50/P99 of
TTFT, TBT and scheduling delay and the throughput, with the simulated/real error of each, and saves the rows
with machine and commit. Run it on a quiet machine:

    .venv/bin/python -m benchmarks.simulator_fidelity
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks.record import save_result
from sarathi.benchmark.runner import run_in_process, warm_up
from sarathi.benchmark.workload import TokenSpace, WorkloadConfig, generate_workload
from sarathi.config import engine_config
from sarathi.engine.llm_engine import LLMEngine
from sarathi.entrypoints.build import build_engine
from sarathi.simulator.cluster import make_replica, simulate, simulation_config
from sarathi.simulator.machine_profile import machine_latency_model

METRICS = (
    "ttft_p50",
    "ttft_p99",
    "tbt_p50",
    "tbt_p99",
    "scheduling_delay_p50",
    "scheduling_delay_p99",
    "throughput_tokens_per_s",
)


def sim_store(config, model, requests):
    replica = make_replica(simulation_config(config), dataclasses.replace(model))
    return simulate([replica], requests)


def saturation_qps(config, model, workload: WorkloadConfig, space: TokenSpace) -> float:
    """Requests per second the simulated engine completes when every request arrives at once."""
    burst = generate_workload(dataclasses.replace(workload, qps=None, num_requests=64), space)
    store = sim_store(config, model, burst)
    finish = max(r.finished_time for r in store.requests.values())
    return len(burst) / finish


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", default="arxiv,sharegpt")
    p.add_argument("--schedulers", default="sarathi,vllm,orca")
    p.add_argument("--loads", default="0.3,0.6,0.85", help="fractions of the simulated saturation QPS")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--length-scale", type=float, default=0.125)
    p.add_argument("--max-total-tokens", type=int, default=1024)
    p.add_argument("--token-budget", type=int, default=64)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()

    base = engine_config(token_budget=args.token_budget)
    model = machine_latency_model(base)
    print(
        f"latency profile: held-out error {model.metadata.get('held_out_error')}, "
        f"engine overhead {model.engine_overhead_s * 1e3:.2f} ms/iteration"
    )
    rows = []
    engines: dict[str, LLMEngine] = {}
    try:
        for trace in args.traces.split(","):
            workload = WorkloadConfig(
                trace=trace,
                num_requests=args.num_requests,
                length_scale=args.length_scale,
                max_total_tokens=args.max_total_tokens,
                seed=0,
            )
            sat = None
            for name in args.schedulers.split(","):
                config = engine_config(scheduler=name, token_budget=args.token_budget)
                if name not in engines:
                    engines[name] = build_engine(config)
                engine = engines[name]
                space = TokenSpace.of_engine(engine)
                if sat is None:
                    sat = saturation_qps(base, model, workload, space)
                    print(f"{trace}: simulated saturation {sat:.2f} req/s")
                for load in (float(x) for x in args.loads.split(",")):
                    qps = load * sat
                    requests = generate_workload(dataclasses.replace(workload, qps=qps), space)
                    warm_up(engine, requests[0].prompt_token_ids[:32])
                    started = time.monotonic()
                    real = run_in_process(engine, requests).summary()
                    real_s = time.monotonic() - started
                    sim = sim_store(config, model, requests).summary()
                    row = {
                        "trace": trace,
                        "scheduler": name,
                        "load": load,
                        "qps": qps,
                        "real_seconds": real_s,
                    }
                    for m in METRICS:
                        row[f"real_{m}"], row[f"sim_{m}"] = real[m], sim[m]
                        row[f"err_{m}"] = (sim[m] - real[m]) / real[m] if real[m] else None
                    rows.append(row)
                    print(format_row(row), flush=True)
    finally:
        for engine in engines.values():
            engine.shutdown()
    print_summary(rows)
    if not args.no_save:
        path = save_result(
            "simulator-fidelity",
            rows,
            {**vars(args), "profile": model.metadata, "overhead": model.engine_overhead_s},
        )
        print(f"saved {path}")
    return 0


def format_row(row: dict) -> str:
    cells = []
    for m in METRICS:
        err = row[f"err_{m}"]
        cells.append(
            f"{m} {row[f'real_{m}']:.3g}/{row[f'sim_{m}']:.3g} ({'-' if err is None else f'{err:+.0%}'})"
        )
    return (
        f"{row['trace']:<9}{row['scheduler']:<8}load {row['load']:.2f} ({row['qps']:.2f} qps): "
        + ", ".join(cells)
    )


def print_summary(rows: list[dict]) -> None:
    """Median and max |error| per metric over all rows (real/sim)."""
    print("\n|metric|median abs error|max abs error|")
    print("|---|---|---|")
    for m in METRICS:
        errs = sorted(abs(r[f"err_{m}"]) for r in rows if r[f"err_{m}"] is not None)
        if errs:
            print(f"|{m}|{errs[len(errs) // 2]:.1%}|{errs[-1]:.1%}|")


if __name__ == "__main__":
    raise SystemExit(main())
