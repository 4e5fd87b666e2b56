"""The demo's calibration: the SLO, the token budget and the load at which ``make demo`` shows the paper on
this machine, all read from its latency profile, and the whole demo in simulated time.

- **SLO**: the paper's strict one, ``DEFAULT_SLO_MULTIPLE`` (5) x the one-sequence decode iteration.
- **Budget**: what ``--token-budget auto`` chooses for that SLO on the demo's own requests (``auto_budget``):
  the highest simulated capacity among budgets whose mixed iteration meets the SLO.
- **Load**: ``load_fraction`` of sarathi's simulated capacity with that budget. Below about half of it new
  prompts rarely arrive while others decode, so no scheduler stalls and the comparison shows nothing;
  at the capacity sarathi's small chunks start to queue prompts (TTFT grows). 0.65 sits where prefills
  overlap decodes on every profile we keep (tests/data/latency-profiles) with sarathi's P99 TTFT within
  1.5x vllm's: on the 2-core Zen4, P99 TBT 52 vs 380 ms in simulation (0.7 gave TTFT 1.41x, 0.75 1.46x).

``simulate_demo`` runs the four schedulers on the same requests in simulated time, and
``predicted_wall_seconds`` adds the one-time profile and the runs' start-up to say how long the real demo
would take on that machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sarathi.benchmark.workload import WorkloadConfig
from sarathi.config import EngineConfig, engine_config
from sarathi.simulator.auto_budget import (
    BudgetChoice,
    choose_token_budget,
    default_tbt_slo,
    profile_error_label,
)
from sarathi.simulator.latency_model import LatencyModel

SCHEDULERS = ("sarathi", "vllm", "orca", "faster_transformer")
# Seconds the real demo spends outside the simulated runs: Python and torch start-up, loading the kernels
# and the model, the budget choice's simulation (a few seconds of CPU), and per run an engine start and
# warm-up request.
STARTUP_ALLOWANCE_S = 30.0
PER_RUN_ALLOWANCE_S = 8.0


@dataclass(frozen=True)
class DemoSettings:
    """The demo's workload and where its load sits."""

    trace: str = "sharegpt"
    # ShareGPT lengths x0.15 (prompts ~340 tokens, outputs ~76 on average), at most 1024 tokens a
    # request: long enough that a whole prompt stalls decodes for several iterations' time, short enough
    # that 40 requests run in about half a minute per scheduler on 2 cores.
    length_scale: float = 0.15
    max_total_tokens: int = 1024
    num_requests: int = 40
    load_fraction: float = 0.65
    seed: int = 0
    dtype: str = "bfloat16"

    def workload(self, qps: float | None = None) -> WorkloadConfig:
        return WorkloadConfig(
            trace=self.trace,
            num_requests=self.num_requests,
            length_scale=self.length_scale,
            max_total_tokens=self.max_total_tokens,
            seed=self.seed,
            qps=qps,
        )

    def engine_config(self, scheduler: str = "sarathi", token_budget: int = 64) -> EngineConfig:
        return engine_config(scheduler=scheduler, token_budget=token_budget, dtype=self.dtype, seed=self.seed)


@dataclass(frozen=True)
class DemoPlan:
    """The calibrated demo: its budget choice (SLO and capacity inside) and load."""

    settings: DemoSettings
    choice: BudgetChoice
    qps: float

    def describe(self) -> str:
        """The lines the demo prints before it runs: machine, SLO, budget and load, each with its reason."""
        c, s = self.choice, self.settings
        return "\n".join(
            [
                f"machine: {c.machine} (profile {c.profile}"
                + (f"; {c.profile_error})" if c.profile_error else ")"),
                f"SLO: P99 TBT <= {c.tbt_slo_s * 1e3:.0f} ms ({c.slo_reason})",
                f"token budget: {c.token_budget} (" + _budget_reason(c) + ")",
                f"load: {self.qps:g} QPS = {s.load_fraction:.0%} of sarathi's simulated capacity "
                f"{c.capacity_qps:.3g} QPS at that SLO and budget: prompts keep arriving while earlier "
                "requests decode, below the point where sarathi's chunked prompts queue up",
            ]
        )


def _budget_reason(c: BudgetChoice) -> str:
    if len(c.candidates) == 1:
        verdict = "meets" if c.meets_slo else "BREAKS"
        return (
            f"given with --token-budget; its mixed iteration, predicted {c.mixed_iteration_s * 1e3:.0f} ms, "
            f"{verdict} the SLO"
        )
    if not c.meets_slo:
        return (
            f"NO budget meets the SLO on this machine; the closest, mixed iteration predicted "
            f"{c.mixed_iteration_s * 1e3:.0f} ms"
        )
    return (
        f"chosen as --token-budget auto does, on these requests: the highest simulated capacity whose "
        f"mixed iteration, predicted {c.mixed_iteration_s * 1e3:.0f} ms, meets the SLO"
    )


def plan_demo(settings: DemoSettings, model: LatencyModel, profile: str = "", machine: str = "") -> DemoPlan:
    """Choose the SLO, budget and load of the demo on the machine ``model`` describes."""
    slo, reason = default_tbt_slo(model)
    choice = choose_token_budget(
        settings.engine_config(), model, slo, reason, settings.workload(), profile=profile, machine=machine
    )
    error = profile_error_label(getattr(model, "metadata", {}))
    return plan_from_choice(settings, dataclasses.replace(choice, profile_error=error))


def plan_from_choice(settings: DemoSettings, choice: BudgetChoice) -> DemoPlan:
    """The demo at ``settings.load_fraction`` of the capacity of ``choice`` (0.05 QPS at least)."""
    return DemoPlan(settings, choice, round(max(settings.load_fraction * choice.capacity_qps, 0.05), 2))


def simulate_demo(plan: DemoPlan, model: LatencyModel, schedulers=SCHEDULERS) -> dict[str, dict]:
    """Every scheduler's summary (``MetricsStore.summary``) on the demo's requests, in simulated time."""
    from sarathi.simulator.cluster import simulation_config
    from sarathi.simulator.simulate_cli import simulate_one

    workload = plan.settings.workload(plan.qps)
    out = {}
    for name in schedulers:
        config = simulation_config(plan.settings.engine_config(name, plan.choice.token_budget))
        store = simulate_one(config, model, workload)
        out[name] = {**store.summary(), "last_token_s": _last_token(store)}
    return out


def _last_token(store) -> float:
    return max((r.token_times[-1] for r in store.requests.values() if r.token_times), default=0.0)


def predicted_wall_seconds(summaries: dict[str, dict], profile_seconds: float = 0.0) -> float:
    """The real demo's wall time: ``profile_seconds`` (0 once the profile is cached), start-up, and each
    run from its first arrival to its last token plus its engine start."""
    runs = sum(s["last_token_s"] + PER_RUN_ALLOWANCE_S for s in summaries.values())
    return profile_seconds + STARTUP_ALLOWANCE_S + runs
