"""``--token-budget auto``: the budget ``sarathi tune`` picks for a TBT SLO on this machine's profile.

The workload is ``sarathi bench``'s default (sharegpt lengths, Poisson arrivals, capped at 2048 tokens);
the profile is this machine's cached one, measured once (with a progress bar) when there is none.
"""

from __future__ import annotations

import dataclasses
import logging

from sarathi.benchmark.capacity import SearchSettings, Slo
from sarathi.benchmark.workload import WorkloadConfig
from sarathi.config import EngineConfig
from sarathi.simulator.tune import DEFAULT_BUDGETS

logger = logging.getLogger(__name__)
AUTO_WORKLOAD = WorkloadConfig(trace="sharegpt", num_requests=128, max_total_tokens=2048)


def auto_token_budget(config: EngineConfig, tbt_slo: float | None, progress: bool = True) -> int:
    """The token budget with the highest simulated capacity under a P99 TBT of ``tbt_slo`` seconds."""
    from sarathi.simulator.cluster import simulation_config
    from sarathi.simulator.machine_profile import machine_latency_model
    from sarathi.simulator.tune_cli import format_result, tune_config

    if tbt_slo is None or not tbt_slo > 0:
        raise ValueError("--token-budget auto needs --tbt-slo SECONDS (the P99 time-between-tokens target)")
    if config.scheduler.name not in ("sarathi", "simple_chunking"):
        raise ValueError(f"--token-budget auto needs a chunking scheduler, not {config.scheduler.name!r}")
    model = machine_latency_model(config, progress=progress)
    sim_config = simulation_config(config)
    result = tune_config(
        sim_config,
        model,
        dataclasses.replace(AUTO_WORKLOAD, seed=config.model.seed),
        Slo(f"{tbt_slo * 1e3:g}ms", tbt_slo),
        DEFAULT_BUDGETS,
        [config.scheduler.max_num_seqs],
        settings=SearchSettings(qps_start=1.0, qps_min=0.01, qps_max=1e4, rel_tol=0.1, max_probes=8),
    )
    print(format_result(result), flush=True)
    if result.best_capacity == 0:
        logger.warning(
            "no token budget meets a P99 TBT of %g s on this machine even at the lowest load; using %d",
            tbt_slo,
            result.best.token_budget,
        )
    return result.best.token_budget
