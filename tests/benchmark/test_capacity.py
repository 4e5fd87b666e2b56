"""Capacity search on synthetic monotone systems with a known threshold."""

from __future__ import annotations

import pytest

from sarathi.benchmark.capacity import Probe, SearchSettings, Slo, find_capacity, resolve_slos


def _system(threshold: float, calls: list[float]):
    """P99 TBT grows with load and crosses 0.1 s exactly at ``threshold`` QPS; delay stays small."""

    def measure(qps: float) -> Probe:
        calls.append(qps)
        return Probe(qps, tbt_p99=0.1 * qps / threshold, scheduling_delay_p50=0.01)

    return measure


@pytest.mark.parametrize("threshold", [0.3, 3.7, 20.0])
def test_bisection_converges_to_the_threshold(threshold):
    calls: list[float] = []
    settings = SearchSettings(qps_start=1.0, qps_min=0.05, qps_max=64.0, rel_tol=0.01, max_probes=40)
    r = find_capacity(_system(threshold, calls), Slo("100ms", 0.1), settings)
    assert r.capacity <= threshold and r.capacity == pytest.approx(threshold, rel=0.01)
    assert r.lowest_failing_qps > threshold
    assert len(r.probes) == len(calls) <= 40


def test_scheduling_delay_bound_limits_capacity():
    def measure(qps: float) -> Probe:  # TBT always fine, but queueing explodes past 2 QPS
        return Probe(qps, tbt_p99=0.01, scheduling_delay_p50=0.1 if qps <= 2.0 else 30.0)

    r = find_capacity(
        measure, Slo("1s", 1.0, max_scheduling_delay=2.0), SearchSettings(rel_tol=0.02, max_probes=30)
    )
    assert r.capacity == pytest.approx(2.0, rel=0.02) and r.capacity <= 2.0


def test_limits_and_probe_budget():
    never = find_capacity(
        lambda q: Probe(q, 10.0, 0.0), Slo("x", 0.1), SearchSettings(qps_min=0.1, max_probes=50)
    )
    assert never.capacity == 0.0 and min(p.qps for p in never.probes) == pytest.approx(0.1)
    always = find_capacity(lambda q: Probe(q, 0.0, 0.0), Slo("x", 0.1), SearchSettings(qps_max=16.0))
    assert always.capacity == 16.0 and always.lowest_failing_qps is None
    few = find_capacity(_system(3.7, []), Slo("x", 0.1), SearchSettings(rel_tol=0.001, max_probes=4))
    assert len(few.probes) == 4 and 0 < few.capacity <= 3.7


def test_slos_from_seconds_and_decode_multiples():
    slos = resolve_slos([0.5], [25.0, 5.0], decode_time=0.04)
    assert [s.tbt_p99 for s in slos] == pytest.approx([0.2, 0.5, 1.0])
    assert slos[0].label.startswith("5x")
    with pytest.raises(ValueError, match="need a positive decode iteration time"):
        resolve_slos([], [5.0], decode_time=None)
    with pytest.raises(ValueError, match="at least one SLO"):
        resolve_slos([], [], decode_time=0.1)
