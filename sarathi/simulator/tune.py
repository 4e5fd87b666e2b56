"""Pick the token budget (and the cap on running requests) for an SLO by simulated capacity.

For every candidate, the capacity search of ``sarathi capacity`` (bracketing and bisection on QPS) runs on
the simulator instead of the real engine; the candidate with the highest capacity wins, ties going to the
smaller budget (shorter iterations, lower TBT).

A candidate is admissible only if its *mixed iteration* (a full chunk beside the decodes that run at its
capacity, ``mixed_iteration``) is predicted to meet the TBT SLO. A P99 over a light load can hide a budget
whose every mixed iteration breaks the SLO, because such iterations are then rarer than 1 in 100 tokens;
the guard keeps tune from choosing one. Where no candidate is admissible with a capacity above zero, the
result says so (``meets_slo`` False) and holds the candidate whose mixed iteration comes closest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sarathi.benchmark.capacity import CapacityResult, Probe, SearchSettings, Slo, find_capacity
from sarathi.config import EngineConfig
from sarathi.core.latency_model import LatencyModel
from sarathi.simulator.cluster import simulate_one
from sarathi.simulator.mixed_iteration import LIGHTEST, LoadShape, mixed_iteration_time

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
    #: Predicted seconds of each candidate's mixed iteration (empty without a check).
    mixed_iteration_s: dict[Candidate, float] = dataclasses.field(default_factory=dict)

    @property
    def best_capacity(self) -> float:
        return self.capacities[self.best].capacity

    @property
    def meets_slo(self) -> bool:
        """Whether the chosen candidate meets the SLO at some load and passes the mixed-iteration check."""
        return self.best_capacity > 0 and self.admissible(self.best)

    def admissible(self, c: Candidate) -> bool:
        return self.mixed_iteration_s.get(c, 0.0) <= self.slo.tbt_p99

    def to_json(self) -> dict:
        return {
            "tbt_slo_s": self.slo.tbt_p99,
            "max_scheduling_delay_s": self.slo.max_scheduling_delay,
            "best": dataclasses.asdict(self.best),
            "best_capacity_qps": self.best_capacity,
            "meets_slo": self.meets_slo,
            "candidates": [
                {
                    **dataclasses.asdict(c),
                    "capacity_qps": r.capacity,
                    "probes": len(r.probes),
                    "mixed_iteration_s": self.mixed_iteration_s.get(c),
                }
                for c, r in self.capacities.items()
            ],
        }


def tune(
    candidates: Sequence[Candidate],
    measure: Callable[[Candidate, float], Probe],
    slo: Slo,
    settings: SearchSettings | None = None,
    on_candidate: Callable[[Candidate, CapacityResult], None] | None = None,
    mixed_iteration: Callable[[Candidate, CapacityResult | None], float] | None = None,
) -> TuneResult:
    """The capacity of every candidate under ``slo`` (``measure(candidate, qps)`` runs one probe) and the
    best admissible one.

    ``mixed_iteration(candidate, capacity)`` predicts the candidate's mixed iteration in seconds at the
    load of its capacity search; it is first asked with ``None`` (the lightest load), and a candidate
    that breaks the SLO even there is not searched.
    """
    if not candidates:
        raise ValueError("no candidates to tune over")
    settings = settings or SearchSettings()
    capacities: dict[Candidate, CapacityResult] = {}
    mixed: dict[Candidate, float] = {}
    for c in candidates:
        if mixed_iteration is not None:
            mixed[c] = mixed_iteration(c, None)
            if mixed[c] > slo.tbt_p99:
                capacities[c] = CapacityResult(0.0)
                if on_candidate is not None:
                    on_candidate(c, capacities[c])
                continue
        capacities[c] = find_capacity(lambda qps, c=c: measure(c, qps), slo, settings)
        if mixed_iteration is not None:
            mixed[c] = mixed_iteration(c, capacities[c])
        if on_candidate is not None:
            on_candidate(c, capacities[c])
    result = TuneResult(slo, capacities, candidates[0], mixed)

    def rank(c: Candidate) -> tuple:
        return capacities[c].capacity, -c.token_budget, -c.max_num_seqs

    passing = [c for c in candidates if capacities[c].capacity > 0 and result.admissible(c)]
    if passing:
        result.best = max(passing, key=rank)
    elif mixed:
        result.best = min(candidates, key=lambda c: (mixed[c], -capacities[c].capacity, c.token_budget))
    else:
        result.best = max(candidates, key=rank)
    return result


def tune_config(
    sim_config: EngineConfig,
    model: LatencyModel,
    workload,
    slo: Slo,
    budgets,
    max_num_seqs_list,
    num_replicas: int = 1,
    router: str = "round_robin",
    qps_start: float = 1.0,
    report=None,
    settings: SearchSettings | None = None,
) -> TuneResult:
    """Simulated capacity of every (budget, max_num_seqs) of ``sim_config``; see ``tune``."""
    candidates = [Candidate(b, m) for m in max_num_seqs_list for b in budgets]
    loads: dict[tuple[Candidate, float], LoadShape] = {}
    block_size = sim_config.cache.block_size

    def measure(c: Candidate, qps: float) -> Probe:
        sched = dataclasses.replace(
            sim_config.scheduler, token_budget=c.token_budget, max_num_seqs=c.max_num_seqs
        )
        config = dataclasses.replace(sim_config, scheduler=sched)
        store = simulate_one(config, model, dataclasses.replace(workload, qps=qps), num_replicas, router)
        loads[c, qps] = LoadShape.of_store(store, block_size)
        s = store.summary()
        return Probe(qps, s["tbt_p99"], s["scheduling_delay_p50"], s["ttft_p99"])

    def mixed(c: Candidate, capacity: CapacityResult | None) -> float:
        load = LIGHTEST
        if capacity is not None and capacity.probes:
            # At the capacity, or at the lightest load probed where no load met the SLO.
            qps = capacity.capacity or min(p.qps for p in capacity.probes)
            load = loads.get((c, qps), LIGHTEST)
        return mixed_iteration_time(model, c.token_budget, load)

    if settings is None:
        settings = SearchSettings(qps_start=qps_start, qps_min=0.01, qps_max=1e4, rel_tol=0.05, max_probes=16)
    return tune(candidates, measure, slo, settings, on_candidate=report, mixed_iteration=mixed)


def format_result(result: TuneResult) -> str:
    """The candidates' table and the choice (or, where none meets the SLO, the closest)."""
    lines = [f"{'token budget':>12}{'max seqs':>10}{'capacity (QPS)':>16}{'mixed iter (ms)':>17}"]
    for c, r in result.capacities.items():
        mark = "  <- chosen" if c == result.best else ""
        mixed = result.mixed_iteration_s.get(c)
        mixed_text = "-" if mixed is None else f"{mixed * 1e3:.0f}"
        lines.append(f"{c.token_budget:>12}{c.max_num_seqs:>10}{r.capacity:>16.3g}{mixed_text:>17}{mark}")
    slo = result.slo
    ttft = f", P99 TTFT <= {slo.ttft_p99:g} s" if slo.ttft_p99 is not None else ""
    if result.meets_slo:
        lines.append(
            f"chosen: --token-budget {result.best.token_budget} --max-num-seqs {result.best.max_num_seqs} "
            f"(predicted capacity {result.best_capacity:.3g} QPS at P99 TBT <= {slo.tbt_p99:g} s{ttft})"
        )
    else:
        mixed = result.mixed_iteration_s.get(result.best)
        closest = f"; its mixed iteration is predicted at {mixed * 1e3:.0f} ms" if mixed is not None else ""
        lines.append(
            f"NO token budget meets P99 TBT <= {slo.tbt_p99:g} s{ttft} on this machine; closest: "
            f"--token-budget {result.best.token_budget} --max-num-seqs {result.best.max_num_seqs}{closest}"
        )
    return "\n".join(lines)
