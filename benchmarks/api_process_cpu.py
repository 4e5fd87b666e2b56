"""The API process's CPU while it streams to many clients, and what sharing the cores does to TBT.

Starts `sarathi serve` (one at a time, on 127.0.0.1) under several placements of its two processes, drives
it with `sarathi bench --url` (N streaming clients that all arrive at once, synthetic lengths), and reads
both processes' CPU time from /proc over the run:

- shared:      the default: the engine core's OpenMP threads on every core, the API process beside them.
- api-niced:   as shared, with the API process at nice 10 (the engine core keeps nice 0).
- split:       the API process pinned to core 0, the engine core to the other cores with one thread fewer.

It prints the API process's CPU (share of one core, and µs per streamed token), the engine core's, the
throughput and TTFT / TBT percentiles per placement, and saves them with the machine and commit.

    python -m benchmarks.api_process_cpu [--clients 64 --prompt-len 64 --output-len 96]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.record import save_result
from benchmarks.server import RunningServer, free_port, serve_command

PLACEMENTS = ("shared", "api-niced", "split")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _start_server(placement: str, serve_flags: list[str], log_path: Path) -> tuple[RunningServer, int]:
    """A server under ``placement``; it and its engine core's PID."""
    cores = sorted(os.sched_getaffinity(0))
    env = {"OMP_NUM_THREADS": str(max(1, len(cores) - 1))} if placement == "split" else None
    port = free_port()
    server = RunningServer(serve_command(port, *serve_flags), port, log_path, env=env, ready_timeout=300)
    try:
        engine_pid = server.config()["engine_core_pid"]
        if placement == "api-niced":
            os.setpriority(os.PRIO_PROCESS, server.pid, 10)
        elif placement == "split" and len(cores) > 1:
            os.sched_setaffinity(server.pid, {cores[0]})
            for tid in os.listdir(f"/proc/{engine_pid}/task"):  # every thread of the engine core
                os.sched_setaffinity(int(tid), set(cores[1:]))
    except BaseException:
        server.stop()
        raise
    return server, engine_pid


def run_placement(placement: str, args: argparse.Namespace, out_dir: Path) -> dict:
    """One server under ``placement``, one burst of ``args.clients`` streaming requests."""
    server, engine_pid = _start_server(placement, args.serve_flags, out_dir / f"{placement}-serve.log")
    with server:
        bench_dir = out_dir / placement
        cmd = [
            sys.executable, "-m", "sarathi", "bench", "--url", server.url, "--trace", "synthetic",
            "--num-requests", str(args.clients), "--qps", "0", "--prompt-len", str(args.prompt_len),
            "--output-len", str(args.output_len), "--output-dir", str(bench_dir), "--no-progress",
        ]  # fmt: skip
        api0, engine0, t0 = cpu_seconds(server.pid), cpu_seconds(engine_pid), time.monotonic()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        api, engine = cpu_seconds(server.pid) - api0, cpu_seconds(engine_pid) - engine0
    summary = json.loads((bench_dir / "summary.json").read_text())[0]
    tokens = args.clients * args.output_len
    return {
        "placement": placement,
        "wall_s": wall,
        "api_cpu_s": api,
        "engine_cpu_s": engine,
        "api_core_share": api / wall,
        "api_us_per_token": api / tokens * 1e6,
        "output_tok_per_s": tokens / wall,
        **{k: summary.get(k) for k in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "tbt_max")},
    }


def _line(r: dict) -> str:
    api = f"API {r['api_core_share']:5.1%} of a core ({r['api_us_per_token']:5.0f} µs/token)"
    engine = f"engine {r['engine_cpu_s'] / r['wall_s']:4.2f} cores, {r['output_tok_per_s']:6.1f} tok/s"
    ttft = f"TTFT p50/p99 {r['ttft_p50']:.2f}/{r['ttft_p99']:.2f} s"
    tbt = f"TBT p50/p99/max {r['tbt_p50'] * 1e3:.0f}/{r['tbt_p99'] * 1e3:.0f}/{r['tbt_max'] * 1e3:.0f} ms"
    return f"{r['placement']:10s} {api}, {engine}, {ttft}, {tbt}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--serve-flags", default="--num-kv-blocks 2048", help="extra flags for sarathi serve")
    args = ap.parse_args()
    args.serve_flags = args.serve_flags.split()
    rows = []
    with tempfile.TemporaryDirectory(prefix="api-cpu-") as tmp:
        for placement in args.placements.split(","):
            rows.append(run_placement(placement, args, Path(tmp)))
            print(_line(rows[-1]), flush=True)
    save_result("api_process_cpu", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
