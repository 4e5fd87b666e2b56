"""Prefix caching on vs off on the multi-turn chat workload: TTFT, capacity and hit rate.

Each setting loads the engine once with ``enable_prefix_caching`` on or off and runs the same chat workload
(sarathi/benchmark/chat_workload.py: a shared system prompt, turns that resend the conversation so far,
think time between turns) in-process:

1. at a fixed conversation rate (``--qps``): TTFT P50/P99, TBT P99, throughput and the hit rate;
2. unless ``--no-capacity``: the capacity, the highest conversation rate whose P99 TBT stays within
   ``--slo`` and whose median scheduling delay stays within ``--max-scheduling-delay`` (bisection on the
   rate, as ``sarathi capacity``). The prefix cache is emptied before every run.

    python -m benchmarks.prefix_caching [--conversations 32 --qps 0.5 --slo 0.5]
"""

from __future__ import annotations

import argparse

from benchmarks.record import save_result
from sarathi.benchmark.bench import BenchConfig, run_one_in_process
from sarathi.benchmark.capacity import Probe, SearchSettings, Slo, find_capacity
from sarathi.benchmark.chat_workload import ChatWorkloadConfig
from sarathi.config import engine_config
from sarathi.entrypoints.build import build_engine

KEYS = ("ttft_p50", "ttft_p99", "tbt_p99", "scheduling_delay_p50", "throughput_tokens_per_s")


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scheduler", default="sarathi")
    parser.add_argument("--token-budget", type=int, default=64)
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="default: the 2 GiB pool")
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--turns", type=_range, default=(2, 6), help="N or MIN,MAX")
    parser.add_argument("--system-prompt-len", type=int, default=256)
    parser.add_argument("--user-len", type=_range, default=(16, 64), help="N or MIN,MAX")
    parser.add_argument("--output-len", type=_range, default=(16, 64), help="N or MIN,MAX")
    parser.add_argument("--think-time", type=float, default=2.0, help="mean seconds between turns")
    parser.add_argument("--max-total-tokens", type=int, default=2048)
    parser.add_argument("--qps", type=float, default=0.5, help="conversations started per second")
    parser.add_argument("--slo", type=float, default=0.5, help="P99 TBT target (seconds) for capacity")
    parser.add_argument("--max-scheduling-delay", type=float, default=2.0)
    parser.add_argument("--qps-start", type=float, default=0.5)
    parser.add_argument("--max-probes", type=int, default=6)
    parser.add_argument("--no-capacity", action="store_true", help="only the fixed-rate runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-save", action="store_true", help="print only, do not write a result record")
    args = parser.parse_args()

    def workload(qps: float) -> ChatWorkloadConfig:
        return ChatWorkloadConfig(
            num_conversations=args.conversations,
            min_turns=args.turns[0],
            max_turns=args.turns[1],
            system_prompt_len=args.system_prompt_len,
            user_min=args.user_len[0],
            user_max=args.user_len[1],
            output_min=args.output_len[0],
            output_max=args.output_len[1],
            think_time=args.think_time,
            qps=qps,
            max_total_tokens=args.max_total_tokens,
            seed=args.seed,
        )

    slo = Slo(f"{args.slo * 1e3:g}ms", args.slo, args.max_scheduling_delay)
    settings = SearchSettings(qps_start=args.qps_start, qps_min=0.02, max_probes=args.max_probes)
    rows = []
    for caching in (True, False):
        label = "prefix-caching" if caching else "no-prefix-caching"
        ec = engine_config(
            scheduler=args.scheduler,
            token_budget=args.token_budget,
            num_kv_blocks=args.num_kv_blocks,
            enable_prefix_caching=caching,
            seed=args.seed,
        )
        config = BenchConfig(label, args.scheduler, args.token_budget)
        engine = build_engine(ec)
        try:
            s = run_one_in_process(ec, workload(args.qps), config, engine).summary
            row = {"label": label, "enable_prefix_caching": caching, "qps": args.qps}
            row |= {k: s[k] for k in KEYS}
            row |= {
                "num_requests": s["num_requests"],
                "num_preemptions": s["num_preemptions"],
                "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
                "prefix_cache_hits": s["prefix_cache_hits"],
                "prefix_cache_queries": s["prefix_cache_queries"],
            }
            hit = row["prefix_cache_hit_rate"]
            print(
                f"{label}: {s['num_requests']} turns at {args.qps:g} conv/s: "
                f"TTFT p50 {s['ttft_p50'] * 1e3:.0f} ms p99 {s['ttft_p99'] * 1e3:.0f} ms, "
                f"TBT p99 {s['tbt_p99'] * 1e3:.0f} ms, {s['throughput_tokens_per_s']:.1f} tok/s, "
                f"hit rate {'-' if hit is None else f'{hit:.1%}'}",
                flush=True,
            )
            if not args.no_capacity:
                probes: dict[float, Probe] = {}

                def measure(qps: float, ec=ec, config=config, engine=engine, probes=probes) -> Probe:
                    if qps not in probes:
                        p = run_one_in_process(ec, workload(qps), config, engine).summary
                        probes[qps] = Probe(qps, p["tbt_p99"], p["scheduling_delay_p50"])
                        print(
                            f"  {config.label} {qps:.3g} conv/s: TBT p99 {p['tbt_p99'] * 1e3:.0f} ms, "
                            f"sched p50 {p['scheduling_delay_p50']:.2f} s, "
                            f"TTFT p50 {p['ttft_p50'] * 1e3:.0f} ms",
                            flush=True,
                        )
                    return probes[qps]

                result = find_capacity(measure, slo, settings)
                row |= {
                    "slo_tbt_p99": slo.tbt_p99,
                    "capacity_conversations_per_s": result.capacity,
                    "lowest_failing_qps": result.lowest_failing_qps,
                    "probes": [vars(p) | {"meets": p.meets(slo)} for p in result.probes],
                }
                print(
                    f"{label}: capacity {result.capacity:.3g} conversations/s within {slo.label}", flush=True
                )
        finally:
            engine.shutdown()
        rows.append(row)

    on, off = rows
    for k in ("ttft_p50", "ttft_p99"):
        if off[k] and on[k]:
            print(f"{k}: {off[k] * 1e3:.0f} ms -> {on[k] * 1e3:.0f} ms ({off[k] / on[k]:.2f}x lower)")
    if not args.no_capacity and off["capacity_conversations_per_s"]:
        ratio = on["capacity_conversations_per_s"] / off["capacity_conversations_per_s"]
        print(f"capacity: {ratio:.2f}x with prefix caching")
    if not args.no_save:
        path = save_result("prefix_caching", rows, settings=vars(args))
        print(f"saved {path}")


if __name__ == "__main__":
    main()
