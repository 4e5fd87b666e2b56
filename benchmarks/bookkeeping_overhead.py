"""Cost of the benchmark's metrics bookkeeping relative to the engine's iteration time.

Runs a real workload on the embedded model through the in-process driver with a store that also logs
every call it receives, then replays exactly those calls (arrivals, first-scheduled times, tokens,
finishes and iteration records, including building the records) into fresh stores in a tight loop. The
replay time per iteration, divided by the mean iteration wall time of the real run, is the overhead the
bookkeeping adds to an iteration. The end-of-run summary is reported separately: it runs once, after the
measurement.

    python -m benchmarks.bookkeeping_overhead [--num-requests 16 --prompt-len 128 --output-len 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.record import save_result
from sarathi.benchmark.metrics_store import MetricsStore
from sarathi.benchmark.runner import run_in_process, warm_up
from sarathi.benchmark.workload import SyntheticLengths, TokenSpace, WorkloadConfig, generate_workload
from sarathi.config import engine_config
from sarathi.entrypoints.build import build_engine


class LoggingStore(MetricsStore):
    """A metrics store that also keeps the list of calls it received, for replay."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def on_arrival(self, *args) -> None:
        self.calls.append(("on_arrival", args))
        super().on_arrival(*args)

    def on_scheduled(self, *args) -> None:
        self.calls.append(("on_scheduled", args))
        super().on_scheduled(*args)

    def on_token(self, *args) -> None:
        self.calls.append(("on_token", args))
        super().on_token(*args)

    def on_finish(self, *args) -> None:
        self.calls.append(("on_finish", args))
        super().on_finish(*args)

    def on_iteration(self, record) -> None:
        self.calls.append(("on_iteration", (record,)))
        super().on_iteration(record)


def replay_seconds(calls: list[tuple[str, tuple]], repeats: int) -> float:
    """Best-of-``repeats`` seconds to feed ``calls`` into a fresh store."""
    best = float("inf")
    for _ in range(repeats):
        store = MetricsStore()
        methods = {
            "on_arrival": store.on_arrival,
            "on_scheduled": store.on_scheduled,
            "on_token": store.on_token,
            "on_finish": store.on_finish,
            "on_iteration": store.on_iteration,
        }
        start = time.perf_counter()
        for name, args in calls:
            methods[name](*args)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scheduler", default="sarathi")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--qps", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-save", action="store_true", help="print only, do not write a result record")
    args = parser.parse_args()

    engine = build_engine(engine_config(scheduler=args.scheduler))
    workload = WorkloadConfig(
        trace="synthetic",
        num_requests=args.num_requests,
        qps=args.qps,
        synthetic=SyntheticLengths(
            "fixed", args.prompt_len, args.prompt_len, args.output_len, args.output_len
        ),
    )
    requests = generate_workload(workload, TokenSpace.of_engine(engine))
    warm_up(engine, requests[0].prompt_token_ids[:32])
    store = run_in_process(engine, requests, LoggingStore())

    iter_times = [it.wall_time for it in store.iterations]
    n_iter = len(iter_times)
    bookkeeping = replay_seconds(store.calls, args.repeats)
    start = time.perf_counter()
    store.summary()
    summary_s = time.perf_counter() - start
    per_iter = bookkeeping / n_iter
    mean_iter = statistics.fmean(iter_times)
    row = {
        "scheduler": args.scheduler,
        "num_iterations": n_iter,
        "num_calls": len(store.calls),
        "mean_iteration_ms": mean_iter * 1e3,
        "median_iteration_ms": statistics.median(iter_times) * 1e3,
        "bookkeeping_per_iteration_us": per_iter * 1e6,
        "overhead_percent": 100 * per_iter / mean_iter,
        "summary_once_ms": summary_s * 1e3,
    }
    print(
        f"{n_iter} iterations, {len(store.calls)} store calls; "
        f"mean iteration {row['mean_iteration_ms']:.1f} ms, "
        f"bookkeeping {row['bookkeeping_per_iteration_us']:.1f} us per iteration = "
        f"{row['overhead_percent']:.4f}% of the iteration time "
        f"(summary once at the end: {summary_s * 1e3:.1f} ms)"
    )
    if not args.no_save:
        path = save_result("bookkeeping_overhead", [row], settings=vars(args))
        print(f"saved {path}")


if __name__ == "__main__":
    main()
