"""Capacity: the highest load (QPS) a scheduler sustains within a P99 TBT SLO and a bound on the median
scheduling delay, found by bracketing and bisection on QPS.

The search assumes the system is monotone in load: if it meets the SLO at some QPS it meets it at every
lower one. Measurements are noisy, so the answer is the highest QPS that *was measured* to meet it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_MAX_SCHEDULING_DELAY = 2.0
# The paper's SLOs as multiples of a decode-only iteration time.
STRICT_MULTIPLE = 5.0
RELAXED_MULTIPLE = 25.0


@dataclass(frozen=True)
class Probe:
    """One measurement at a load."""

    qps: float
    tbt_p99: float
    scheduling_delay_p50: float
    ttft_p99: float = math.nan

    def meets(self, slo: Slo) -> bool:
        return (
            math.isfinite(self.tbt_p99)
            and self.tbt_p99 <= slo.tbt_p99
            and math.isfinite(self.scheduling_delay_p50)
            and self.scheduling_delay_p50 <= slo.max_scheduling_delay
            and (slo.ttft_p99 is None or (math.isfinite(self.ttft_p99) and self.ttft_p99 <= slo.ttft_p99))
        )


@dataclass(frozen=True)
class Slo:
    """A latency target: P99 TBT (seconds), the median scheduling delay bound (seconds) and, optionally,
    a P99 TTFT bound (seconds)."""

    label: str
    tbt_p99: float
    max_scheduling_delay: float = DEFAULT_MAX_SCHEDULING_DELAY
    ttft_p99: float | None = None

    def __post_init__(self) -> None:
        if not self.tbt_p99 > 0:
            raise ValueError(f"the TBT SLO must be > 0 s, got {self.tbt_p99}")
        if self.ttft_p99 is not None and not self.ttft_p99 > 0:
            raise ValueError(f"the TTFT SLO must be > 0 s, got {self.ttft_p99}")
        if not self.max_scheduling_delay > 0:
            raise ValueError(f"the scheduling delay bound must be > 0 s, got {self.max_scheduling_delay}")


@dataclass(frozen=True)
class SearchSettings:
    """Where the QPS search starts, its limits, and when it stops (relative bracket width or probes)."""

    qps_start: float = 1.0
    qps_min: float = 0.05
    qps_max: float = 64.0
    rel_tol: float = 0.1
    max_probes: int = 10

    def __post_init__(self) -> None:
        if not 0 < self.qps_min <= self.qps_start <= self.qps_max:
            raise ValueError(
                "need 0 < qps_min <= qps_start <= qps_max, "
                f"got {self.qps_min}, {self.qps_start}, {self.qps_max}"
            )
        if not 0 < self.rel_tol < 1:
            raise ValueError(f"rel_tol must be in (0, 1), got {self.rel_tol}")
        if self.max_probes < 1:
            raise ValueError(f"max_probes must be >= 1, got {self.max_probes}")


@dataclass
class CapacityResult:
    """The capacity (0.0 when even ``qps_min`` fails) and the probes the search looked at, in order."""

    capacity: float
    probes: list[Probe] = field(default_factory=list)
    lowest_failing_qps: float | None = None


def find_capacity(measure: Callable[[float], Probe], slo: Slo, settings: SearchSettings) -> CapacityResult:
    """Double (or halve) the QPS from ``qps_start`` until the SLO's pass/fail boundary is bracketed, then
    bisect (geometric midpoint) until the bracket is within ``rel_tol`` or ``max_probes`` are spent.

    ``measure`` runs the system at a QPS; memoize it to share probes between several SLOs.
    """
    result = CapacityResult(0.0)
    ok: float | None = None  # highest QPS measured to meet the SLO
    bad: float | None = None  # lowest QPS measured to miss it
    qps = settings.qps_start
    while len(result.probes) < settings.max_probes:
        probe = measure(qps)
        result.probes.append(probe)
        if probe.meets(slo):
            ok = qps if ok is None else max(ok, qps)
        else:
            bad = qps if bad is None else min(bad, qps)
        if bad is None:
            if ok >= settings.qps_max:
                break
            qps = min(ok * 2, settings.qps_max)
        elif ok is None:
            if bad <= settings.qps_min:
                break
            qps = max(bad / 2, settings.qps_min)
        else:
            if (bad - ok) / bad <= settings.rel_tol:
                break
            qps = math.sqrt(ok * bad)
    result.capacity = ok if ok is not None else 0.0
    result.lowest_failing_qps = bad
    return result


def resolve_slos(
    slos_s: list[float],
    multiples: list[float],
    decode_time: float | None,
    max_scheduling_delay: float = DEFAULT_MAX_SCHEDULING_DELAY,
) -> list[Slo]:
    """SLOs given in seconds and as multiples of a decode-only iteration time (needs ``decode_time``),
    sorted by target."""
    slos = [Slo(f"{s * 1e3:g}ms", s, max_scheduling_delay) for s in slos_s]
    if multiples:
        if decode_time is None or not decode_time > 0:
            raise ValueError("SLO multiples need a positive decode iteration time")
        slos += [
            Slo(f"{m:g}x ({m * decode_time * 1e3:.0f}ms)", m * decode_time, max_scheduling_delay)
            for m in multiples
        ]
    if not slos:
        raise ValueError("give at least one SLO (seconds or a multiple of the decode iteration time)")
    return sorted(slos, key=lambda s: s.tbt_p99)
