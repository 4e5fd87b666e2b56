"""Serving probes for benchmarks/vs_llama_cpp.py: one load replayed against a running server (guarded against
foreign CPU load), a setting's capacity searches per SLO over one memo of probes, and choosing among settings.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.cpu_load import busy_seconds, foreign_load, own_seconds
from benchmarks.server import RunningServer
from sarathi.benchmark.capacity import Probe, SearchSettings, Slo, find_capacity

SLOS = (Slo("strict 100ms", 0.1, 2.0), Slo("relaxed 500ms", 0.5, 2.0))
LENGTH_SCALE = 0.125
MAX_TOTAL_TOKENS = 1024
MAX_FOREIGN_LOAD = 0.08


@dataclass(frozen=True)
class ServerSetting:
    """One server configuration: ``llama.cpp`` with a logical batch ``-b``, or ``sarathi`` with a budget."""

    server: str
    knob: int

    @property
    def label(self) -> str:
        return f"llama.cpp -b {self.knob}" if self.server == "llama.cpp" else f"sarathi budget {self.knob}"


@dataclass
class ProbeRecord:
    """One measured load of one setting: the headline metrics, the foreign load, and the metrics store."""

    qps: float
    ttft_p50: float
    ttft_p99: float
    tbt_p50: float
    tbt_p99: float
    throughput_tokens_per_s: float
    num_requests: int
    num_failed: int
    foreign_load: float
    tries: int
    disturbed: bool
    store: object = field(default=None, repr=False)

    def probe(self) -> Probe:
        """The capacity search's view: a failed request fails the probe; median TTFT bounds the delay."""
        if self.num_failed:
            return Probe(self.qps, math.inf, math.inf, math.inf)
        return Probe(self.qps, self.tbt_p99, self.ttft_p50, self.ttft_p99)

    def row(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "store"}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def qps_key(qps: float) -> float:
    return float(f"{qps:.6g}")


def workload_config(trace: str, qps: float, num_requests: int, seed: int):
    from sarathi.benchmark.workload import WorkloadConfig

    return WorkloadConfig(
        trace=trace,
        num_requests=num_requests,
        qps=qps,
        arrival="poisson",
        length_scale=LENGTH_SCALE,
        max_total_tokens=MAX_TOTAL_TOKENS,
        seed=seed,
    )


def fresh_prompts(requests: Sequence, allowed, salt: Sequence[int]) -> list:
    """``requests`` with the same arrivals and lengths but prompt ids drawn anew from ``allowed`` with a
    generator seeded by ``salt``: a server never sees a prompt twice, so no probe is served from the prefix
    cache of an earlier one (sarathi's prefix caching, llama-server's per-slot prompt reuse)."""
    import numpy as np

    rng = np.random.default_rng(list(salt))
    return [
        dataclasses.replace(
            r,
            prompt_token_ids=tuple(
                int(x) for x in allowed[rng.integers(0, len(allowed), r.num_prompt_tokens)]
            ),
        )
        for r in requests
    ]


def measure_probe(
    server: RunningServer,
    make_requests: Callable[[int], Sequence],
    qps: float,
    retries: int,
    max_foreign: float = MAX_FOREIGN_LOAD,
) -> ProbeRecord:
    """Replay ``make_requests(attempt)`` against the server; repeat (up to ``retries`` more times, with new
    prompts) while other processes used more than ``max_foreign`` of the machine; keep the least disturbed
    try."""
    from sarathi.benchmark.http_client import run_http

    best: ProbeRecord | None = None
    ncpu = os.cpu_count() or 1
    for attempt in range(1, retries + 2):
        requests = make_requests(attempt)
        busy0, own0, srv0, t0 = busy_seconds(), own_seconds(), server.cpu_seconds(), time.perf_counter()
        store, errors = run_http(server.url, requests, progress=False)
        wall = time.perf_counter() - t0
        load = foreign_load(
            busy_seconds() - busy0, own_seconds() - own0, server.cpu_seconds() - srv0, wall, ncpu
        )
        s = store.summary()
        rec = ProbeRecord(
            qps=qps,
            ttft_p50=s["ttft_p50"],
            ttft_p99=s["ttft_p99"],
            tbt_p50=s["tbt_p50"],
            tbt_p99=s["tbt_p99"],
            throughput_tokens_per_s=s["throughput_tokens_per_s"],
            num_requests=len(requests),
            num_failed=len(errors),
            foreign_load=load,
            tries=attempt,
            disturbed=load > max_foreign,
            store=store,
        )
        for e in errors[:3]:
            print(f"    warning: request failed: {e}", file=sys.stderr)
        if best is None or rec.foreign_load < best.foreign_load:
            best = dataclasses.replace(rec, tries=attempt)
        best.tries = attempt
        if load <= max_foreign:
            break
        print(f"    foreign CPU load {load:.0%} during the probe: repeating it", flush=True)
    return best


@dataclass
class SettingResult:
    """A setting's capacity per SLO and every probe it ran (by QPS)."""

    setting: ServerSetting
    workload: str
    capacity: dict[str, float] = field(default_factory=dict)
    lowest_failing: dict[str, float | None] = field(default_factory=dict)
    probes: dict[float, ProbeRecord] = field(default_factory=dict)

    def row(self) -> dict:
        return {
            "workload": self.workload,
            "server": self.setting.server,
            "label": self.setting.label,
            "knob": self.setting.knob,
            "capacity_qps": self.capacity,
            "lowest_failing_qps": self.lowest_failing,
            "probes": [p.row() for _, p in sorted(self.probes.items())],
        }


def capacity_searches(
    measure: Callable[[float], ProbeRecord],
    slos: Sequence[Slo],
    settings: SearchSettings,
    result: SettingResult,
) -> SettingResult:
    """``find_capacity`` per SLO over one memo of probes (a load is measured once for all SLOs)."""

    def probe(qps: float) -> Probe:
        key = qps_key(qps)
        if key not in result.probes:
            result.probes[key] = measure(key)
        return result.probes[key].probe()

    for slo in slos:
        r = find_capacity(probe, slo, settings)
        result.capacity[slo.label] = r.capacity
        result.lowest_failing[slo.label] = r.lowest_failing_qps
    return result


def best_setting(results: Sequence[SettingResult], slo: Slo) -> SettingResult:
    """The highest capacity under ``slo``; a tie goes to the lower P99 TBT at that capacity, then to the
    smaller knob."""

    def key(r: SettingResult):
        cap = r.capacity[slo.label]
        at = r.probes.get(qps_key(cap)) if cap > 0 else None
        tbt = at.tbt_p99 if at is not None and math.isfinite(at.tbt_p99) else math.inf
        return (-cap, tbt, r.setting.knob)

    if not results:
        raise ValueError("no settings to choose from")
    return min(results, key=key)


def shared_loads(results: Sequence[SettingResult]) -> list[float]:
    """The loads every one of ``results`` was probed at, ascending."""
    if not results:
        return []
    common = set(results[0].probes)
    for r in results[1:]:
        common &= set(r.probes)
    return sorted(common)


def cdf_load(results: Sequence[SettingResult], slo: Slo) -> float | None:
    """The shared load for the CDF plots: the highest one at which every setting meets ``slo``, else the
    lowest shared one (None when they share none)."""
    loads = shared_loads(results)
    meeting = [q for q in loads if all(r.probes[q].probe().meets(slo) for r in results)]
    return meeting[-1] if meeting else (loads[0] if loads else None)


def pow2_near(x: float) -> float:
    """The power of two nearest ``x`` on a log scale (1.0 for x <= 0)."""
    return 2.0 ** round(math.log2(x)) if x > 0 else 1.0
