"""Stall budget: how much one heavy-but-legal request slows everyone else on a default ``sarathi serve``.

A "victim" stream decodes throughout (greedy, ``ignore_eos``). Its median gap between tokens is measured
first, alone. Then each heavy request runs to completion beside it, one at a time:

- a large JSON schema (400 properties, each an enum), compiled in the checker's helper process and then on
  the sampling worker's build thread;
- ``guided_choice`` with 1,000 choices;
- ``prompt_logprobs`` (20 alternatives) on a 2,000-token prompt;
- ``n=16`` choices of a 500-token prompt;
- and, as a control, the same 2,000-token prompt without log probabilities: the victim's gaps beside its
  prefill chunks are what the token budget allows, so a heavy request that stays near the control's gap
  stalls no one beyond one iteration's budget.

Each runs ``--repeats`` times (a new constraint each time, so no compile is cached). For each it reports the
victim's worst gap while the heavy request was in flight, as a multiple of the victim's median gap alone in
the ``--before-s`` seconds just before that run (the victim's own context grows through the benchmark, and
so does its step), the median over the repeats (target <= 3x); and the slowest ``/health`` answer, polled
every 50 ms (target < 200 ms).
Saves the rows with the machine and the commit. Run it on a quiet machine:

    python -m benchmarks.stall_budget [--server-args "--dtype float32"]
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

from benchmarks.record import save_result
from benchmarks.server import RunningServer, free_port, serve_command

GAP_TARGET = 3.0
HEALTH_TARGET_S = 0.2


def schema(salt: int) -> dict:
    """400 enum properties; ``salt`` makes each repeat a new constraint (no cached compile)."""
    return {
        "type": "object",
        "properties": {f"field_{salt}_{i}": {"type": "string", "enum": ["x", "y"]} for i in range(400)},
        "required": [f"field_{salt}_0"],
    }


def prompt_ids(length: int, salt: int) -> list[int]:
    """Token ids, so the prompt has exactly ``length`` tokens; each salt a new prompt (no cached prefix)."""
    return [1000 + (7 * salt + i) % 40_000 for i in range(length)]


def heavy_requests(salt: int) -> dict[str, dict]:
    return {
        "json schema, 400 properties": {"prompt": "JSON:", "max_tokens": 16, "guided_json": schema(salt)},
        "1,000 choices": {
            "prompt": "Pick:",
            "max_tokens": 8,
            "guided_choice": [f"choice number {i} of list {salt}" for i in range(1000)],
        },
        "prompt logprobs, 2,000 tokens": {
            "prompt": prompt_ids(2000, salt),
            "max_tokens": 1,
            "prompt_logprobs": 20,
        },
        # The control: the same prompt without log probabilities. Its chunks beside the victim are the
        # iteration the token budget allows; the heavy requests should cost no more than that.
        "control: plain 2,000-token prompt": {"prompt": prompt_ids(2000, salt), "max_tokens": 1},
        "n=16, 500-token prompt": {
            "prompt": prompt_ids(500, salt),
            "max_tokens": 32,
            "n": 16,
            "temperature": 1.0,
        },
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
            if r.status_code != 200:
                raise RuntimeError(f"the victim stream was refused: {r.status_code} {r.read().decode()}")
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
    p.add_argument("--repeats", type=int, default=3, help="runs of each heavy request (median reported)")
    p.add_argument(
        "--before-s", type=float, default=1.5, help="seconds the victim runs alone before each heavy request"
    )
    args = p.parse_args()
    port = free_port()
    command = serve_command(port, *shlex.split(args.server_args))
    rows = []
    log = Path("stall_budget_results") / "server.log"
    # One client for the heavy requests: a new httpx client per request builds a TLS context (tens of ms of
    # CPU in this process), and on 2 shared cores that burst lands on the victim's gaps as if the server
    # had caused it.
    with RunningServer(command, port, log) as server, httpx.Client(timeout=600) as client:
        url = server.url
        victim = Victim(url, max_tokens=8000)  # within the default 8192-token context
        stop, health = threading.Event(), []
        prober = threading.Thread(target=health_probe, args=(url, stop, health), daemon=True)
        prober.start()
        time.sleep(1.0)  # past the victim's prefill
        start = time.monotonic()
        time.sleep(args.baseline_s)
        alone = victim.gaps_between(start, time.monotonic())
        median = statistics.median(alone)
        p99_alone = statistics.quantiles(alone, n=100)[98]
        print(
            f"victim alone: median gap {median * 1e3:.1f} ms, p99 {p99_alone * 1e3:.1f} ms, "
            f"worst {max(alone) * 1e3:.1f} ms",
            flush=True,
        )
        salts = itertools.count(1)  # every run a new constraint and a new prompt
        for name in heavy_requests(0):
            runs = []
            for _ in range(args.repeats):
                body = heavy_requests(next(salts))[name]
                quiet = time.monotonic()
                time.sleep(args.before_s)
                start = time.monotonic()
                before = statistics.median(victim.gaps_between(quiet, start))
                r = client.post(f"{url}/v1/completions", json=body)
                end = time.monotonic()
                if r.status_code != 200:
                    print(f"{name}: {r.status_code} {r.text[:300]}", flush=True)
                time.sleep(0.2)  # the victim's next token after the heavy request ends closes the last gap
                gaps = victim.gaps_between(start, end)
                worst_health = max((s for t, s in health if start <= t <= end), default=0.0)
                runs.append((r.status_code, end - start, max(gaps, default=0.0), worst_health, before))
            worst_gaps = [g for _, _, g, _, _ in runs]
            row = {
                "request": name,
                "statuses": [code for code, *_ in runs],
                "seconds_median": round(statistics.median(t for _, t, *_ in runs), 3),
                "victim_median_gap_alone_ms": round(median * 1e3, 2),
                "victim_p99_gap_alone_ms": round(p99_alone * 1e3, 2),
                "victim_median_gap_before_ms_per_run": [round(b * 1e3, 1) for *_, b in runs],
                "victim_worst_gap_ms_per_run": [round(g * 1e3, 1) for g in worst_gaps],
                "worst_gap_vs_median": round(statistics.median(g / b for _, _, g, _, b in runs), 2),
                "worst_health_ms": round(max(h for _, _, _, h, _ in runs) * 1e3, 1),
            }
            row["meets_targets"] = all(code == 200 for code in row["statuses"]) and (
                row["worst_gap_vs_median"] <= GAP_TARGET and row["worst_health_ms"] < HEALTH_TARGET_S * 1e3
            )
            rows.append(row)
            print(
                f"{name:32s} {row['statuses']} {row['seconds_median']:7.2f} s  worst gap per run "
                f"{row['victim_worst_gap_ms_per_run']} ms, median gap before "
                f"{row['victim_median_gap_before_ms_per_run']} ms ({row['worst_gap_vs_median']:.1f}x)  "
                f"worst /health {row['worst_health_ms']:6.1f} ms",
                flush=True,
            )
        stop.set()
        victim.stop()
    path = save_result("stall_budget", rows, vars(args))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
