"""Pick the token budget (and the cap on running requests) for an SLO by simulated capacity.

For every candidate, the capacity search of ``sarathi capacity`` (bracketing and bisection on QPS) runs on
the simulator instead of the real engine; the candidate with the highest capacity wins, ties going to the
smaller budget (shorter iterations, lower TBT).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sarathi.benchmark.capacity import CapacityResult, Probe, SearchSettings, Slo, find_capacity

DEFAULT_BUDGETS = (32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class Candidate:
    """One setting to try."""

    token_budget: int
    max_num_seqs: int


@dataclass
class TuneResult:
    """Every candidate's capacity (QPS) and the chosen one."""

    slo: Slo
    capacities: dict[Candidate, CapacityResult]
    best: Candidate

    @property
    def best_capacity(self) -> float:
        return self.capacities[self.best].capacity

    def to_json(self) -> dict:
        return {
            "tbt_slo_s": self.slo.tbt_p99,
            "max_scheduling_delay_s": self.slo.max_scheduling_delay,
            "best": dataclasses.asdict(self.best),
            "best_capacity_qps": self.best_capacity,
            "candidates": [
                {**dataclasses.asdict(c), "capacity_qps": r.capacity, "probes": len(r.probes)}
                for c, r in self.capacities.items()
            ],
        }


def tune(
    candidates: Sequence[Candidate],
    measure: Callable[[Candidate, float], Probe],
    slo: Slo,
    settings: SearchSettings | None = None,
    on_candidate: Callable[[Candidate, CapacityResult], None] | None = None,
) -> TuneResult:
    """The capacity of every candidate under ``slo`` (``measure(candidate, qps)`` runs one probe) and the
    best of them."""
    if not candidates:
        raise ValueError("no candidates to tune over")
    settings = settings or SearchSettings()
    capacities: dict[Candidate, CapacityResult] = {}
    for c in candidates:
        capacities[c] = find_capacity(lambda qps, c=c: measure(c, qps), slo, settings)
        if on_candidate is not None:
            on_candidate(c, capacities[c])
    best = max(capacities, key=lambda c: (capacities[c].capacity, -c.token_budget, -c.max_num_seqs))
    return TuneResult(slo, capacities, best)
