"""Metrics store: fed at every request arrival, token and iteration; exports CSVs, CDFs and a summary.

All times are seconds on one clock (``time.monotonic`` in-process, the client's clock over HTTP). Derived
request metrics: scheduling delay (arrival to first scheduled), TTFT, every time-between-tokens gap,
end-to-end latency and end-to-end latency normalized by the number of output tokens.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sarathi.benchmark.pipeline_trace import bubble_fractions, chrome_trace
from sarathi.engine.step_messages import StageTiming
from sarathi.metrics import percentile
from sarathi.outputs import IterationStats

REQUEST_COLUMNS = (
    "request_id",
    "arrival_time",
    "num_prompt_tokens",
    "num_output_tokens",
    "scheduling_delay",
    "ttft",
    "tbt_mean",
    "tbt_max",
    "e2e_latency",
    "normalized_e2e_latency",
    "num_preemptions",
    "finished",
)
ITERATION_COLUMNS = (
    "iteration",
    "start_time",
    "wall_time",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_seqs",
    "num_preempted",
    "prefix_cache_queries",
    "prefix_cache_hits",
)
# Metrics written to cdf.csv: RequestRecord attributes, and 'tbt' for every time-between-tokens gap.
CDF_METRICS = ("ttft", "tbt", "scheduling_delay", "e2e_latency", "normalized_e2e_latency")


@dataclass
class RequestRecord:
    """One request's timeline as the store saw it (absolute times on the store's clock)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    target_output_tokens: int
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    num_preemptions: int | None = 0

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def finished(self) -> bool:
        return self.finished_time is not None

    @property
    def scheduling_delay(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def tbts(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def normalized_e2e_latency(self) -> float | None:
        e2e = self.e2e_latency
        return None if e2e is None or not self.token_times else e2e / len(self.token_times)


class MetricsStore:
    """Collects request timelines and iteration records of one benchmark run.

    ``on_arrival`` / ``on_scheduled`` / ``on_token`` / ``on_finish`` are called as events happen and
    ``on_iteration`` once per engine iteration; everything else is derived afterwards.
    """

    def __init__(self) -> None:
        self.requests: dict[str, RequestRecord] = {}
        self.iterations: list[IterationStats] = []
        self.stage_timings: list[StageTiming] = []

    # --- feeding -----------------------------------------------------------------------------------------
    def on_arrival(
        self, request_id: str, arrival_time: float, num_prompt_tokens: int, num_output: int
    ) -> None:
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} already arrived")
        self.requests[request_id] = RequestRecord(request_id, arrival_time, num_prompt_tokens, num_output)

    def on_scheduled(self, request_id: str, time: float) -> None:
        """The first time the request was scheduled (later calls are ignored)."""
        rec = self.requests[request_id]
        if rec.first_scheduled_time is None:
            rec.first_scheduled_time = time

    def on_token(self, request_id: str, time: float) -> None:
        self.requests[request_id].token_times.append(time)

    def on_finish(self, request_id: str, time: float, num_preemptions: int | None = 0) -> None:
        rec = self.requests[request_id]
        rec.finished_time = time
        rec.num_preemptions = num_preemptions

    def on_iteration(self, record: IterationStats) -> None:
        self.iterations.append(record)

    def on_stage_timings(self, timings: Sequence[StageTiming]) -> None:
        """Pipeline stages' start/end of each micro-batch (in-process runs only)."""
        self.stage_timings.extend(timings)

    # --- derived -----------------------------------------------------------------------------------------
    def _values(self, metric: str) -> list[float]:
        recs = self.requests.values()
        if metric == "tbt":
            return [g for r in recs for g in r.tbts]
        return [v for r in recs if (v := getattr(r, metric)) is not None]

    def summary(self) -> dict:
        """Percentiles of the request metrics (seconds), throughput and counts of the whole run."""
        recs = list(self.requests.values())
        ttft, tbt = self._values("ttft"), self._values("tbt")
        delay, e2e = self._values("scheduling_delay"), self._values("e2e_latency")
        norm = self._values("normalized_e2e_latency")
        out_tokens = sum(r.num_output_tokens for r in recs)
        start = min((r.arrival_time for r in recs), default=0.0)
        end = max((r.token_times[-1] for r in recs if r.token_times), default=start)
        duration = end - start
        preempt = [r.num_preemptions for r in recs]
        iter_times = [it.wall_time for it in self.iterations]
        return {
            "num_requests": len(recs),
            "num_finished": sum(r.finished for r in recs),
            "num_prompt_tokens": sum(r.num_prompt_tokens for r in recs),
            "num_output_tokens": out_tokens,
            "duration_s": duration,
            "ttft_p50": percentile(ttft, 50),
            "ttft_p90": percentile(ttft, 90),
            "ttft_p99": percentile(ttft, 99),
            "tbt_p50": percentile(tbt, 50),
            "tbt_p90": percentile(tbt, 90),
            "tbt_p99": percentile(tbt, 99),
            "tbt_max": max(tbt, default=math.nan),
            "scheduling_delay_p50": percentile(delay, 50),
            "scheduling_delay_p99": percentile(delay, 99),
            "e2e_p50": percentile(e2e, 50),
            "e2e_p99": percentile(e2e, 99),
            "normalized_e2e_p50": percentile(norm, 50),
            "normalized_e2e_p99": percentile(norm, 99),
            "throughput_tokens_per_s": out_tokens / duration if duration > 0 else math.nan,
            "num_preemptions": None if None in preempt else sum(preempt),
            "num_iterations": len(self.iterations),
            "iteration_time_p50": percentile(iter_times, 50),
            **self._prefix_cache_summary(),
            **self._pipeline_summary(),
        }

    def _prefix_cache_summary(self) -> dict:
        """Admitted tokens looked up in the prefix cache and the share found (None when nothing was
        looked up: caching off, or an HTTP run, which has no iteration records)."""
        queries = sum(it.prefix_cache_queries for it in self.iterations)
        hits = sum(it.prefix_cache_hits for it in self.iterations)
        return {
            "prefix_cache_queries": queries,
            "prefix_cache_hits": hits,
            "prefix_cache_hit_rate": hits / queries if queries else None,
        }

    def _pipeline_summary(self) -> dict:
        bubbles = bubble_fractions(self.stage_timings)
        return {
            "pipeline_stages": len(bubbles) or None,
            "pipeline_bubble_fraction": sum(bubbles) / len(bubbles) if bubbles else None,
            "pipeline_bubble_fraction_per_stage": bubbles or None,
        }

    def request_rows(self) -> list[dict]:
        rows = []
        for r in self.requests.values():
            tbts = r.tbts
            rows.append(
                {
                    "request_id": r.request_id,
                    "arrival_time": r.arrival_time,
                    "num_prompt_tokens": r.num_prompt_tokens,
                    "num_output_tokens": r.num_output_tokens,
                    "scheduling_delay": r.scheduling_delay,
                    "ttft": r.ttft,
                    "tbt_mean": sum(tbts) / len(tbts) if tbts else None,
                    "tbt_max": max(tbts, default=None),
                    "e2e_latency": r.e2e_latency,
                    "normalized_e2e_latency": r.normalized_e2e_latency,
                    "num_preemptions": r.num_preemptions,
                    "finished": r.finished,
                }
            )
        return rows

    def cdf(self, metric: str) -> list[tuple[float, float]]:
        """Empirical CDF of a request metric (or 'tbt' for every gap): sorted (value, fraction <= value)."""
        xs = sorted(self._values(metric))
        n = len(xs)
        return [(x, (i + 1) / n) for i, x in enumerate(xs)]

    # --- export ------------------------------------------------------------------------------------------
    def write(self, folder: str | Path, extra_summary: dict | None = None) -> dict:
        """Write requests.csv, iterations.csv (when there are iterations), cdf.csv, summary.json and, with
        stage timings, the Chrome / Perfetto trace.json."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _write_csv(folder / "requests.csv", REQUEST_COLUMNS, self.request_rows())
        if self.iterations:
            rows = [{c: getattr(it, c) for c in ITERATION_COLUMNS} for it in self.iterations]
            _write_csv(folder / "iterations.csv", ITERATION_COLUMNS, rows)
        cdf_rows = [{"metric": m, "value": v, "cdf": p} for m in CDF_METRICS for v, p in self.cdf(m)]
        _write_csv(folder / "cdf.csv", ("metric", "value", "cdf"), cdf_rows)
        if self.stage_timings:
            trace = chrome_trace(self.stage_timings, self.iterations)
            (folder / "trace.json").write_text(json.dumps(trace) + "\n")
        summary = {**(extra_summary or {}), **self.summary()}
        (folder / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")
        return summary


def json_safe(value):
    """NaN and infinities become None (strict JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _write_csv(path: Path, columns, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)
