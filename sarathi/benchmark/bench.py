"""Running a benchmark in process: one engine configuration at a time over one workload, its summary entry,
its files (summary.json, CSVs, plots) and the headline table. ``sarathi bench`` and ``sarathi capacity``
drive it; so does the simulator, which writes the same outputs."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from sarathi.benchmark.chat_workload import ChatSession, ChatWorkloadConfig, generate_conversations
from sarathi.benchmark.metrics_store import MetricsStore, json_safe
from sarathi.benchmark.workload import TokenSpace, WorkloadConfig, generate_workload
from sarathi.config import SCHEDULER_NAMES, EngineConfig
from sarathi.core.schedulers import SCHEDULERS
from sarathi.engine.llm_engine import LLMEngine

CHAT = "chat"
SUMMARY_KEYS = (
    "scheduler",
    "token_budget",
    "qps",
    "num_requests",
    "ttft_p50",
    "ttft_p99",
    "tbt_p50",
    "tbt_p99",
    "tbt_max",
    "scheduling_delay_p50",
    "e2e_p50",
    "throughput_tokens_per_s",
    "num_preemptions",
)


@dataclass(frozen=True)
class BenchConfig:
    """One engine configuration of a benchmark: a label and the scheduler settings it varies."""

    label: str
    scheduler: str
    token_budget: int | str  # "auto" only for a live server (--url), which chose its own


@dataclass
class BenchRun:
    """The outcome of one config: its metrics store and summary entry."""

    config: BenchConfig
    store: MetricsStore
    summary: dict


def bench_configs(schedulers: list[str], budgets: list[int]) -> list[BenchConfig]:
    """Every scheduler x budget; schedulers that ignore the budget run once (with the first budget)."""
    for s in schedulers:
        if s not in SCHEDULER_NAMES:
            raise ValueError(f"unknown scheduler {s!r}; choose one of: {', '.join(SCHEDULER_NAMES)}")
    if not schedulers or not budgets:
        raise ValueError("need at least one scheduler and one token budget")
    configs = []
    for s in dict.fromkeys(schedulers):
        chunked = SCHEDULERS[s].chunked_prefills  # bounded by the token budget; the others ignore it
        for b in budgets if chunked else budgets[:1]:
            label = f"{s}@{b}" if len(budgets) > 1 and chunked else s
            configs.append(BenchConfig(label, s, b))
    return configs


def run_one_in_process(
    engine_config: EngineConfig,
    workload: WorkloadConfig | ChatWorkloadConfig,
    config: BenchConfig,
    engine: LLMEngine,
    progress: bool = False,
) -> BenchRun:
    """Warm ``engine`` (built for ``engine_config``) up, replay the workload and summarize."""
    from sarathi.benchmark.runner import run_in_process, warm_up

    space = TokenSpace.of_engine(engine)
    if isinstance(workload, ChatWorkloadConfig):
        conversations = generate_conversations(workload, space)
        warm_up(engine, conversations[0].system_token_ids[:32] or conversations[0].turns[0].user_token_ids)
        requests = ChatSession(conversations)
    else:
        requests = generate_workload(workload, space)
        warm_up(engine, requests[0].prompt_token_ids[:32])
    store = run_in_process(engine, requests, progress=progress, desc=config.label)
    entry = summary_entry(config, workload, store, "in-process")
    entry["model"] = engine_config.model.model or "embedded SmolLM2-135M-Instruct"
    entry["dtype"] = engine_config.model.dtype
    entry["compute_dtype"] = engine_config.model.compute_dtype
    from sarathi.model.loader import effective_quantization

    entry["quantization"] = effective_quantization(engine_config.model)
    entry["tensor_parallel_size"] = engine_config.parallel.tensor_parallel_size
    entry["pipeline_parallel_size"] = engine_config.parallel.pipeline_parallel_size
    return BenchRun(config, store, entry)


# Both modes write the same keys; these are the ones only one mode knows (None in the other).
_MODE_KEYS = {
    "model": None,
    "dtype": None,
    "compute_dtype": None,
    "quantization": None,
    "tensor_parallel_size": None,
    "pipeline_parallel_size": None,
    "url": None,
    "num_failed": 0,
}


def summary_entry(
    config: BenchConfig, workload: WorkloadConfig | ChatWorkloadConfig, store: MetricsStore, mode: str
) -> dict:
    """The summary.json entry of one run: identity, workload settings, then the store's metrics."""
    chat = isinstance(workload, ChatWorkloadConfig)
    return {
        "label": config.label,
        "scheduler": config.scheduler,
        "token_budget": config.token_budget,
        "qps": workload.qps,
        "mode": mode,
        "trace": CHAT if chat else workload.trace,
        "arrival": "poisson" if chat else workload.arrival,
        "length_scale": None if chat else workload.length_scale,
        "max_total_tokens": workload.max_total_tokens,
        "seed": workload.seed,
        **({"chat": dataclasses.asdict(workload)} if chat else {}),
        **_MODE_KEYS,
        **store.summary(),
    }


def write_results(runs: list[BenchRun], folder: str | Path) -> list[Path]:
    """summary.json, one folder of CSVs per run, and the plots; returns the plot files."""
    from sarathi.benchmark.plots import plot_bench

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for run in runs:
        run.store.write(folder / run.config.label, extra_summary=run.summary)
    entries = [json_safe(r.summary) for r in runs]
    (folder / "summary.json").write_text(json.dumps(entries, indent=2) + "\n")
    return plot_bench({r.config.label: r.store for r in runs}, folder)


def format_table(entries: list[dict]) -> str:
    """A fixed-width table of the headline metrics (milliseconds for latencies)."""

    def ms(v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:.0f}"

    def num(v, fmt):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    head = (
        f"{'config':<22}{'TTFT p50':>10}{'TTFT p99':>10}{'TBT p50':>9}{'TBT p99':>9}{'TBT max':>9}"
        f"{'sched p50':>11}{'tok/s':>8}{'preempt':>9}"
    )
    lines = [head, "-" * len(head)]
    for e in entries:
        lines.append(
            f"{e['label']:<22}{ms(e['ttft_p50']):>10}{ms(e['ttft_p99']):>10}{ms(e['tbt_p50']):>9}"
            f"{ms(e['tbt_p99']):>9}{ms(e['tbt_max']):>9}{ms(e['scheduling_delay_p50']):>11}"
            f"{num(e['throughput_tokens_per_s'], '.1f'):>8}{num(e['num_preemptions'], 'd'):>9}"
        )
    return "\n".join(lines) + "\n(latencies in ms; tok/s = output tokens per second)"
