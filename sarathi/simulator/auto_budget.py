"""``--token-budget auto``: the token budget for a P99 TBT SLO, chosen by simulation on this machine's
latency profile, printed with its reason and cached beside the profile.

The SLO defaults to the paper's strict one: ``DEFAULT_SLO_MULTIPLE`` (5) x the one-sequence decode
iteration of this machine, read from its profile. The budget is ``sarathi tune``'s choice on
``AUTO_WORKLOAD`` (sharegpt lengths, Poisson arrivals, capped at 2048 tokens and the context length): the
highest simulated capacity among the budgets whose mixed iteration meets the SLO (``tune.py``). Where no
budget meets it, the printed reason says so and the closest one is used.

The choice depends only on the profile, the SLO, the scheduler settings and the workload, so it is cached
under those (``budget-choices/`` in the profile folder): the first start on a machine simulates for a few
seconds, later starts read the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sarathi.benchmark.capacity import STRICT_MULTIPLE, SearchSettings, Slo
from sarathi.benchmark.workload import WorkloadConfig
from sarathi.config import DEFAULT_TOKEN_BUDGET, EngineConfig
from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.core.schedulers import SCHEDULERS

AUTO_WORKLOAD = WorkloadConfig(trace="sharegpt", num_requests=64, max_total_tokens=2048)
AUTO_BUDGETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
DEFAULT_SLO_MULTIPLE = STRICT_MULTIPLE
#: The cached tokens of the one-sequence decode that the default SLO is a multiple of.
DECODE_CONTEXT = 256
_CHOICE_VERSION = 3
# Coarse (capacity within ~30%), so a first start simulates for seconds; enough to rank budgets.
AUTO_SEARCH = SearchSettings(qps_start=0.25, qps_min=0.01, qps_max=1e4, rel_tol=0.15, max_probes=6)


@dataclass(frozen=True)
class BudgetChoice:
    """A chosen token budget and why: the SLO and where it came from, the predicted capacity at it, the
    predicted mixed iteration, whether the SLO is met at all, and the profile it was read from."""

    token_budget: int
    tbt_slo_s: float
    slo_reason: str
    capacity_qps: float
    mixed_iteration_s: float
    meets_slo: bool
    profile: str
    machine: str
    workload: str
    candidates: list[dict]
    profile_error: str = ""

    def describe(self) -> str:
        """The lines printed at start-up."""
        head = f"token budget auto: P99 TBT SLO {self.tbt_slo_s * 1e3:.0f} ms ({self.slo_reason})"
        if self.meets_slo:
            verdict = (
                f"chosen {self.token_budget}: the highest predicted capacity ({self.capacity_qps:.3g} QPS "
                f"on the {self.workload} workload) among the budgets whose mixed iteration (a full chunk "
                f"beside the decodes at that load, predicted {self.mixed_iteration_s * 1e3:.0f} ms) meets "
                "the SLO"
            )
        else:
            verdict = (
                f"NO token budget meets this SLO on this machine; using {self.token_budget}, the closest "
                f"(its mixed iteration is predicted at {self.mixed_iteration_s * 1e3:.0f} ms); "
                "set a looser --tbt-slo or a budget by hand (--token-budget N)"
            )
        error = f"; {self.profile_error}" if self.profile_error else ""
        return f"{head}\n  {verdict}\n  profile: {self.profile} ({self.machine}{error})"


def one_sequence_decode_s(model: LatencyModel) -> float:
    """Predicted seconds of an iteration holding one decode after ``DECODE_CONTEXT`` cached tokens."""
    return model.iteration_time(BatchShape.from_grid(0, 1, DECODE_CONTEXT))


def default_tbt_slo(model: LatencyModel) -> tuple[float, str]:
    """The paper's strict SLO on this machine, and its reason in words."""
    decode = one_sequence_decode_s(model)
    return DEFAULT_SLO_MULTIPLE * decode, (
        f"default: {DEFAULT_SLO_MULTIPLE:g}x the one-sequence decode iteration of {decode * 1e3:.1f} ms "
        "on this machine, the paper's strict SLO; --tbt-slo sets it"
    )


def choose_token_budget(
    config: EngineConfig,
    model: LatencyModel,
    tbt_slo: float,
    slo_reason: str,
    workload: WorkloadConfig | None = None,
    budgets=None,
    profile: str = "",
    machine: str = "",
    search: SearchSettings = AUTO_SEARCH,
) -> BudgetChoice:
    """Simulate ``config``'s scheduler on ``workload`` for every budget and choose one (see ``tune``)."""
    from sarathi.simulator.tune import tune_config

    sim_config, workload = _simulation(config, model, workload or AUTO_WORKLOAD)
    result = tune_config(
        sim_config,
        model,
        workload,
        Slo(f"{tbt_slo * 1e3:g}ms", tbt_slo),
        budgets or AUTO_BUDGETS,
        [config.scheduler.max_num_seqs],
        settings=search,
    )
    return BudgetChoice(
        token_budget=result.best.token_budget,
        tbt_slo_s=tbt_slo,
        slo_reason=slo_reason,
        capacity_qps=result.best_capacity,
        mixed_iteration_s=result.mixed_iteration_s[result.best],
        meets_slo=result.meets_slo,
        profile=profile,
        machine=machine,
        workload=workload.trace,
        candidates=result.to_json()["candidates"],
    )


def _simulation(config: EngineConfig, model: LatencyModel, workload: WorkloadConfig):
    """``config`` without weights, and ``workload`` capped to the context it can hold."""
    from sarathi.simulator.cluster import make_replica, simulation_config

    sim_config = simulation_config(config)
    max_len = make_replica(sim_config, model).engine.max_model_len
    cap = min(workload.max_total_tokens or max_len, max_len)
    return sim_config, dataclasses.replace(workload, max_total_tokens=cap, seed=config.model.seed)


def auto_budget_choice(
    config: EngineConfig,
    tbt_slo: float | None = None,
    progress: bool = True,
    workload: WorkloadConfig | None = None,
    search: SearchSettings = AUTO_SEARCH,
) -> BudgetChoice:
    """The cached choice for ``config`` and ``tbt_slo`` (None: the default SLO), made (and cached) when
    there is none; printed unless ``progress`` is False. Profiles the machine once if it has no profile."""
    from sarathi.simulator.machine_profile import machine_latency_model, machine_profile_path
    from sarathi.simulator.measured import MeasuredLatencyModel

    if not SCHEDULERS[config.scheduler.name].chunked_prefills:
        raise ValueError(f"--token-budget auto needs a chunking scheduler, not {config.scheduler.name!r}")
    if tbt_slo is not None and not tbt_slo > 0:
        raise ValueError(f"--tbt-slo must be > 0 seconds, got {tbt_slo}")
    model = machine_latency_model(config, progress=progress)
    path = machine_profile_path(config)
    if tbt_slo is None:
        tbt_slo, reason = default_tbt_slo(model)
    else:
        reason = "--tbt-slo"
    workload = workload or AUTO_WORKLOAD
    cache = _choice_path(path, config, tbt_slo, workload, search)
    choice = _load_choice(cache)
    if choice is None:
        machine = machine_label(model.metadata) if isinstance(model, MeasuredLatencyModel) else "unknown"
        choice = choose_token_budget(
            config, model, tbt_slo, reason, workload, profile=str(path), machine=machine, search=search
        )
        choice = dataclasses.replace(choice, profile_error=profile_error_label(model.metadata))
        _save_choice(cache, choice)
    if progress:
        print(choice.describe(), flush=True)
    return choice


def auto_token_budget(config: EngineConfig, tbt_slo: float | None = None, progress: bool = True) -> int:
    """The budget of ``auto_budget_choice``; schedulers without a token budget get the default."""
    if not SCHEDULERS[config.scheduler.name].chunked_prefills:
        return DEFAULT_TOKEN_BUDGET
    return auto_budget_choice(config, tbt_slo, progress).token_budget


def profile_error_label(metadata: dict) -> str:
    """The profile's 5-fold held-out error in words ("" when it was not recorded)."""
    e = metadata.get("held_out_error")
    if not isinstance(e, dict):
        return ""
    return f"held-out error median {e['median']:.1%}, p90 {e['p90']:.1%}, max {e['max']:.1%}"


def machine_label(metadata: dict) -> str:
    """The machine a profile was measured on, from its metadata (older profiles name the CPU only)."""
    cpu = metadata.get("cpu")
    if cpu is None:
        return "unknown machine"
    if isinstance(cpu, dict):
        flags = " ".join(cpu.get("flags", []))
        cpu = f"{cpu.get('vendor')} family {cpu.get('family')} model {cpu.get('model')} [{flags}]"
    name = metadata.get("cpu_name")
    return f"{f'{name}, ' if name else ''}{cpu}, {metadata.get('cores', '?')} cores"


def choice_cache_dir() -> Path:
    """Where choices are cached: beside the cached profiles."""
    from sarathi.model.embedded import cache_root

    return cache_root() / "latency-profiles" / "budget-choices"


def _choice_path(
    profile: Path, config: EngineConfig, tbt_slo: float, workload: WorkloadConfig, search: SearchSettings
) -> Path:
    s, c = config.scheduler, config.cache
    key = {
        "version": _CHOICE_VERSION,
        "profile": hashlib.sha256(profile.read_bytes()).hexdigest(),
        "tbt_slo_us": round(tbt_slo * 1e6),
        "scheduler": s.name,
        "max_num_seqs": s.max_num_seqs,
        "chunk_schedule": None if s.chunk_schedule is None else dataclasses.asdict(s.chunk_schedule),
        "num_kv_blocks": c.num_kv_blocks,
        "kv_cache_memory_gib": c.kv_cache_memory_gib,
        "max_model_len": config.model.max_model_len,
        "workload": dataclasses.asdict(workload),
        "budgets": list(AUTO_BUDGETS),
        "search": dataclasses.asdict(search),
        "seed": config.model.seed,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return choice_cache_dir() / f"{digest}.json"


def _load_choice(path: Path) -> BudgetChoice | None:
    try:
        return BudgetChoice(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _save_choice(path: Path, choice: BudgetChoice) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(choice), indent=2) + "\n")
    tmp.replace(path)  # atomic: concurrent starts never read half a file
