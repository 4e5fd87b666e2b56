"""``make demo``: stall-free batching vs the baselines, measured under load on the embedded SmolLM2-135M.

ShareGPT request lengths (scaled down so the run fits a small CPU) arrive as a Poisson process at a rate
where new prompts keep arriving while earlier requests decode. Every scheduler sees the same requests at
the same times, in-process. Prefill-first schedulers (vllm, orca) stall every running decode for whole
prompts, which shows as a long tail of time-between-tokens; faster_transformer never mixes prompts into a
running batch, so requests wait long to be scheduled; sarathi chunks prompts under the token budget and
keeps decodes going. Prints the table and writes summary.json, CSVs and plots to ``--output-dir``.

Everything is calibrated to the machine from its latency profile (measured once, about a minute and a
half on 2 cores, then cached, and measured again when two of its points timed at the start are more than
20% off; see ``benchmarks/demo_plan.py``): the SLO is the paper's strict one
(5x this machine's one-sequence decode iteration; its relaxed one, 25x, said so, where no budget meets the
strict one), the token budget is what ``--token-budget auto`` chooses for it on the demo's requests, and the
load is the lowest fraction of sarathi's simulated capacity with that budget at which prompts really overlap
decodes (a prefill-first scheduler's simulated P99 TBT reaches the relaxed SLO and 5x sarathi's predicted
mixed iteration). The demo prints each with its reason, and the simulator's prediction of the table, before
it runs.

The Figure 7 demo that ``make demo`` ran before is ``python -m benchmarks.figure7``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from benchmarks.demo_plan import SCHEDULERS, DemoSettings
from sarathi.entrypoints.cli import main as sarathi_main


def main() -> int:
    d = DemoSettings()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--trace", default=d.trace)
    parser.add_argument("--length-scale", type=float, default=d.length_scale)
    parser.add_argument("--max-total-tokens", type=int, default=d.max_total_tokens)
    parser.add_argument("--num-requests", type=int, default=d.num_requests)
    parser.add_argument("--qps", type=float, default=None, help="default: --load x simulated capacity")
    parser.add_argument(
        "--load",
        type=float,
        default=None,
        help="fraction of sarathi's simulated capacity (default: the lowest where prompts overlap decodes)",
    )
    parser.add_argument("--token-budget", default="auto", help="'auto' (default) or a number of tokens")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--dtype", default=d.dtype)
    parser.add_argument("--output-dir", default="demo_results")
    args = parser.parse_args()
    settings = DemoSettings(
        trace=args.trace,
        length_scale=args.length_scale,
        max_total_tokens=args.max_total_tokens,
        num_requests=args.num_requests,
        load_fractions=d.load_fractions if args.load is None else (args.load,),
        stall_multiple=d.stall_multiple if args.load is None else 0.0,
        seed=args.seed,
        dtype=args.dtype,
    )
    budget = args.token_budget
    if args.qps is None or budget == "auto":
        plan = calibrate(settings, None if budget == "auto" else int(budget))
        budget = str(plan.choice.token_budget)
        if args.qps is None:
            args.qps = plan.qps
    print(
        f"{args.num_requests} {args.trace} requests (lengths x{args.length_scale:g}, at most "
        f"{args.max_total_tokens} tokens), Poisson arrivals at {args.qps:g} QPS, token budget "
        f"{budget}, SmolLM2-135M --dtype {args.dtype}"
        f"{' (its Q4_1 file in its own blocks)' if args.dtype == 'auto' else ''}; "
        f"schedulers: {args.schedulers}",
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
            budget,
            "--seed",
            str(args.seed),
            "--dtype",
            args.dtype,
            "--output-dir",
            args.output_dir,
        ]
    )


def calibrate(settings: DemoSettings, token_budget: int | None):
    """The demo's plan on this machine (its profile is measured once if there is none), printed with the
    simulator's prediction of the four schedulers."""
    from benchmarks.demo_plan import DEMO_SEARCH, demo_plan_for, plan_from_choice, simulate_demo
    from sarathi.simulator.auto_budget import (
        auto_budget_choice,
        choose_token_budget,
        default_tbt_slo,
        machine_label,
        profile_error_label,
    )
    from sarathi.simulator.machine_profile import machine_latency_model, machine_profile_path

    config = settings.engine_config()
    # profiles once, with a progress bar; a cached profile is checked against the machine now
    model = machine_latency_model(config, recheck=True)
    if token_budget is None:

        def choose(slo: float | None, reason: str = ""):
            workload = settings.workload()
            made = auto_budget_choice(config, slo, progress=False, workload=workload, search=DEMO_SEARCH)
            return made if slo is None else dataclasses.replace(made, slo_reason=reason)

        plan = demo_plan_for(settings, model, choose)
    else:
        slo, reason = default_tbt_slo(model)
        choice = choose_token_budget(
            config,
            model,
            slo,
            reason,
            settings.workload(),
            budgets=[token_budget],
            profile=str(machine_profile_path(config)),
            machine=machine_label(model.metadata),
            search=DEMO_SEARCH,
        )
        choice = dataclasses.replace(choice, profile_error=profile_error_label(model.metadata))
        plan = plan_from_choice(settings, choice, model)
    print(plan.describe(), file=sys.stderr)
    predicted = simulate_demo(plan, model)
    rows = ", ".join(f"{name} {s['tbt_p99'] * 1e3:.0f} ms" for name, s in predicted.items())
    print(f"predicted P99 TBT (simulation of these requests): {rows}", file=sys.stderr, flush=True)
    return plan


if __name__ == "__main__":
    sys.exit(main())
