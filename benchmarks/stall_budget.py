"""Stall budget: how much one heavy-but-legal request slows everyone else on a default ``sarathi serve``.

A "victim" stream decodes throughout (greedy, ``ignore_eos``). Its median gap between tokens is measured
first, alone. Then each heavy request runs to completion beside it, one at a time:

- a large JSON schema (400 properties, each an enum), compiled in the checker's helper process and then on
  the sampling worker's build thread;
- ``guided_choice`` with 1,000 choices;
- ``prompt_logprobs`` (20 alternatives) on a 2,000-token prompt;
- ``n=16`` choices of a 500-token prompt.

For each it reports the victim's worst gap while the heavy request was in flight, as a multiple of the
median gap alone (target <= 3x), and the slowest ``/health`` answer, polled every 50 ms (target < 200 ms).
Saves the rows with the machine and the commit. Run it on a quiet machine:

    python benchmarks/stall_budget.py [--server-args "--dtype float32"]
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
from record import save_result
from server_process import RunningServer, free_port

GAP_TARGET = 3.0
HEALTH_TARGET_S = 0.2
SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "string", "enum": ["x", "y"]} for i in range(400)},
    "required": ["field_0"],
}


def heavy_requests() -> dict[str, dict]:
    words = " ".join(f"w{i}" for i in range(4000))
    return {
        "json schema, 400 properties": {"prompt": "JSON:", "max_tokens": 16, "guided_json": SCHEMA},
        "1,000 choices": {
            "prompt": "Pick:",
            "max_tokens": 8,
            "guided_choice": [f"choice number {i} of a long list" for i in range(1000)],
        },
        "prompt logprobs, 2,000 tokens": {"prompt": words, "max_tokens": 1, "prompt_logprobs": 20},
        "n=16, 500-token prompt": {"prompt": words[:2000], "max_tokens": 32, "n": 16, "temperature": 1.0},
    }


class Victim:
    """A long greedy stream; records when each token arrived."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.times: list[float] = []
        self._stop = threading.Event()
        body = {"prompt": "Count:", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict) -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=None) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.times.append(time.monotonic())
                if self._stop.is_set():
                    return

    def gaps_between(self, start: float, end: float) -> list[float]:
        times = list(self.times)
        return [b - a for a, b in itertools.pairwise(times) if b > start and a < end]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def health_probe(url: str, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            start = time.monotonic()
            client.get(f"{url}/health")
            samples.append((start, time.monotonic() - start))
            time.sleep(0.05)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server-args", default="", help="extra flags for sarathi serve")
    p.add_argument("--baseline-s", type=float, default=5.0, help="seconds the victim runs alone first")
    args = p.parse_args()
    port = free_port()
    command = [sys.executable, "-m", "sarathi", "serve", "--port", str(port), *shlex.split(args.server_args)]
    rows = []
    log = Path("stall_budget_results") / "server.log"
    with RunningServer(command, port, log) as server:
        url = server.url
        victim = Victim(url, max_tokens=100_000)
        stop, health = threading.Event(), []
        prober = threading.Thread(target=health_probe, args=(url, stop, health), daemon=True)
        prober.start()
        time.sleep(1.0)  # past the victim's prefill
        start = time.monotonic()
        time.sleep(args.baseline_s)
        alone = victim.gaps_between(start, time.monotonic())
        median = statistics.median(alone)
        print(f"victim alone: median gap {median * 1e3:.1f} ms, worst {max(alone) * 1e3:.1f} ms", flush=True)
        for name, body in heavy_requests().items():
            start = time.monotonic()
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
            end = time.monotonic()
            time.sleep(0.2)  # the victim's next token after the heavy request ends closes the last gap
            gaps = victim.gaps_between(start, end)
            worst_health = max((s for t, s in health if start <= t <= end), default=0.0)
            row = {
                "request": name,
                "status": r.status_code,
                "seconds": round(end - start, 3),
                "victim_median_gap_alone_ms": round(median * 1e3, 2),
                "victim_worst_gap_ms": round(max(gaps, default=0.0) * 1e3, 2),
                "worst_gap_vs_median": round(max(gaps, default=0.0) / median, 2),
                "worst_health_ms": round(worst_health * 1e3, 1),
            }
            row["meets_targets"] = r.status_code == 200 and (
                row["worst_gap_vs_median"] <= GAP_TARGET and worst_health < HEALTH_TARGET_S
            )
            rows.append(row)
            print(
                f"{name:32s} {r.status_code} {row['seconds']:7.2f} s  "
                f"worst gap {row['victim_worst_gap_ms']:7.1f} ms ({row['worst_gap_vs_median']:.1f}x)  "
                f"worst /health {row['worst_health_ms']:6.1f} ms",
                flush=True,
            )
        stop.set()
        victim.stop()
    path = save_result("stall_budget", rows, {"server_args": args.server_args, "baseline_s": args.baseline_s})
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
