"""Latency summaries over finished requests: TTFT, TBT, scheduling delay, end-to-end, throughput."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sarathi.outputs import RequestMetrics


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class LatencySummary:
    """Distribution of request latencies (seconds) and output throughput over a set of requests."""

    num_requests: int
    ttft_p50: float
    ttft_p99: float
    tbt_p50: float
    tbt_p99: float
    tbt_max: float
    scheduling_delay_p50: float
    e2e_p50: float
    output_tokens_per_s: float

    @classmethod
    def of(cls, metrics: list[RequestMetrics]) -> LatencySummary:
        ttfts = [m.ttft for m in metrics if m.ttft is not None]
        tbts = [g for m in metrics for g in m.tbts]
        delays = [m.scheduling_delay for m in metrics if m.scheduling_delay is not None]
        e2e = [m.e2e_latency for m in metrics if m.e2e_latency is not None]
        tokens = sum(len(m.token_times) for m in metrics)
        start = min((m.arrival_time for m in metrics), default=0.0)
        end = max((m.token_times[-1] for m in metrics if m.token_times), default=start)
        return cls(
            num_requests=len(metrics),
            ttft_p50=percentile(ttfts, 50),
            ttft_p99=percentile(ttfts, 99),
            tbt_p50=percentile(tbts, 50),
            tbt_p99=percentile(tbts, 99),
            tbt_max=max(tbts, default=math.nan),
            scheduling_delay_p50=percentile(delays, 50),
            e2e_p50=percentile(e2e, 50),
            output_tokens_per_s=tokens / (end - start) if end > start else math.nan,
        )
