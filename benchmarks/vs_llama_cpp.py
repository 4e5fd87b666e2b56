"""sarathi's server vs llama.cpp's ``llama-server`` on this CPU: same weights, same client, same workloads.

llama.cpp comes from the package registry only: the llama-cpp-python sdist carries its full source, built
once with cmake + ninja into the project cache (benchmarks/llama_cpp_build.py, about 6 minutes on 2 cores);
``llama-quantize`` turns the embedded SmolLM2-135M Q4_1 GGUF into BF16, the weights sarathi serves too.

Each server setting runs alone on the machine: start it (127.0.0.1, a free port), drive it with the
streaming client of ``sarathi bench --url`` (sarathi/benchmark/http_client.py), stop it by its PID.

- llama.cpp: ``llama-server -t 2 -np 16 -c 32768 --cache-ram 0 -cb -b B -ub min(B, 512)`` for B in
  32, 64, 256, 2048; the best B per SLO (highest capacity) is the row compared against.
- sarathi: ``sarathi serve`` with its default token budget, and with the budget ``sarathi tune`` picks for
  the SLO on this workload (simulated capacity on this machine's cached latency profile).

Workloads: arxiv and sharegpt lengths scaled x1/8, at most 1024 tokens a request, Poisson arrivals, fixed
seeds, 64 requests a probe (48 with --quick); every probe (and every retry) draws new prompt token ids, so
no server is served from a prefix cache of an earlier probe. Capacity = the highest QPS with P99 TBT
within the SLO and median TTFT within 2 s (the HTTP client cannot see the scheduling delay; TTFT bounds
it), by the bisection of sarathi/benchmark/capacity.py, at a strict SLO of 100 ms and a relaxed one of
500 ms. Every search starts at the same QPS (a power of two near sarathi's simulated capacity), so the
settings are probed at shared loads, where TTFT and TBT percentiles are compared side by side.

Foreign CPU load is guarded as in benchmarks/model_forward.py: a probe during which other processes used
more than 8% of the machine is repeated; a probe still disturbed after the retries is kept and flagged.

Writes benchmarks/results/vs-llama-cpp-<date>-<commit>.json and, in --output-dir, capacity bars per SLO and
TBT and TTFT CDFs at one shared load per workload.

    .venv/bin/python -m benchmarks.vs_llama_cpp --quick   # one workload, -b 64 and 2048, 3 probes per search
    .venv/bin/python -m benchmarks.vs_llama_cpp           # both workloads, all four -b, 6 probes per search
    .venv/bin/python -m benchmarks.vs_llama_cpp --quick --model gemma3-270m   # Gemma 3 270M: its Q4_K_M
                                                          # file requantized to BF16 vs our bf16 default
    .venv/bin/python -m benchmarks.vs_llama_cpp --quick --quantization gguf   # both on the shipped file's
                                                          # own quantized blocks (SmolLM2: Q4_1)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.cpu_load import busy_seconds, foreign_load, own_seconds
from benchmarks.llama_cpp_build import (
    LLAMA_CPP_PYTHON_VERSION,
    binary,
    build_info,
    ensure_bf16_gguf,
    ensure_gguf,
    ensure_llama_cpp,
    llama_cpp_version,
)
from benchmarks.record import save_result
from benchmarks.server import HOST, RunningServer, free_port, serve_command
from sarathi.benchmark.capacity import Probe, SearchSettings, Slo, find_capacity

SLOS = (Slo("strict 100ms", 0.1, 2.0), Slo("relaxed 500ms", 0.5, 2.0))
LLAMA_BATCHES = (32, 64, 256, 2048)
QUICK_LLAMA_BATCHES = (64, 2048)
WORKLOADS = ("arxiv", "sharegpt")
QUICK_WORKLOADS = ("arxiv",)
LENGTH_SCALE = 0.125
MAX_TOTAL_TOKENS = 1024
LLAMA_THREADS, LLAMA_PARALLEL, LLAMA_CTX = 2, 16, 32768
MAX_FOREIGN_LOAD = 0.08


@dataclass(frozen=True)
class ServerSetting:
    """One server configuration: ``llama.cpp`` with a logical batch ``-b``, or ``sarathi`` with a budget."""

    server: str
    knob: int

    @property
    def label(self) -> str:
        return f"llama.cpp -b {self.knob}" if self.server == "llama.cpp" else f"sarathi budget {self.knob}"


def llama_server_command(
    server_binary: str | Path,
    model: str | Path,
    port: int,
    batch: int,
    threads: int = LLAMA_THREADS,
    parallel: int = LLAMA_PARALLEL,
    ctx: int = LLAMA_CTX,
) -> list[str]:
    """``llama-server`` with continuous batching over ``parallel`` slots sharing ``ctx`` tokens, logical
    batch ``batch`` and physical batch min(batch, 512), no prompt cache in RAM, bound to 127.0.0.1."""
    return [
        str(server_binary),
        "-m",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        "-t",
        str(threads),
        "-np",
        str(parallel),
        "-c",
        str(ctx),
        "--cache-ram",
        "0",
        "-cb",
        "-b",
        str(batch),
        "-ub",
        str(min(batch, 512)),
    ]


def sarathi_serve_command(
    port: int,
    token_budget: int,
    model: str | None = None,
    python: str = sys.executable,
    quantized: bool = False,
) -> list[str]:
    """``sarathi serve`` of ``model`` (default: the embedded one) with ``token_budget``: bf16, or with
    ``quantized`` the GGUF's own blocks (``--quantization gguf``)."""
    flags = ["--token-budget", str(token_budget), *(["--model", model] if model else [])]
    flags += ["--quantization", "gguf"] if quantized else []
    return serve_command(port, *flags, python=python)


def server_command(
    setting: ServerSetting,
    port: int,
    model_gguf: str | Path | None = None,
    model: str | None = None,
    quantized: bool = False,
) -> list[str]:
    if setting.server == "llama.cpp":
        if model_gguf is None:
            raise ValueError("llama.cpp needs a GGUF file")
        return llama_server_command(binary("llama-server"), model_gguf, port, setting.knob)
    if setting.server == "sarathi":
        return sarathi_serve_command(port, setting.knob, model, quantized=quantized)
    raise ValueError(f"unknown server {setting.server!r}")


def model_files(model: str | None, quantized: bool = False) -> tuple[Path, str]:
    """The GGUF llama.cpp serves (BF16, or with ``quantized`` the shipped file itself) and the converted
    folder sarathi reads (its tokenizer) for ``model`` (None: the embedded SmolLM2; or a packaged model's
    name such as gemma3-270m)."""
    from sarathi.model.embedded import (
        PACKAGED_MODELS,
        embedded_gguf_path,
        embedded_model_path,
        packaged_model_path,
    )

    if model is None:
        return (embedded_gguf_path() if quantized else ensure_bf16_gguf()), embedded_model_path()
    shipped = PACKAGED_MODELS[model].gguf_path()
    return (shipped if quantized else ensure_gguf("BF16", src=shipped)), packaged_model_path(model)


# ---------------------------------------------------------------------------------------------------------
# Probes and capacity


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


# ---------------------------------------------------------------------------------------------------------
# sarathi's budget for an SLO (what ``sarathi tune`` picks on this workload)


def tuned_budgets(
    trace: str, slos: Sequence[Slo], seed: int, model: str | None = None
) -> tuple[dict[str, int], dict[str, dict]]:
    """Per SLO: the budget with the highest simulated capacity on this machine's latency profile (the
    ``sarathi tune`` search over its default candidates), and every candidate's simulated capacity."""
    from sarathi.config import engine_config
    from sarathi.simulator.cluster import simulation_config
    from sarathi.simulator.machine_profile import machine_latency_model
    from sarathi.simulator.tune import DEFAULT_BUDGETS, tune_config

    base = engine_config(model)
    latency = machine_latency_model(base)
    sim_workload = workload_config(trace, 1.0, 256, seed)
    budgets, sims = {}, {}
    for slo in slos:
        r = tune_config(
            simulation_config(base),
            latency,
            sim_workload,
            slo,
            DEFAULT_BUDGETS,
            [base.scheduler.max_num_seqs],
            settings=SearchSettings(qps_start=1.0, qps_min=0.01, qps_max=1e4, rel_tol=0.1, max_probes=8),
        )
        budgets[slo.label] = r.best.token_budget
        sims[slo.label] = {str(c.token_budget): v.capacity for c, v in r.capacities.items()}
    return budgets, sims


# ---------------------------------------------------------------------------------------------------------
# The run


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one workload, -b 64 and 2048, 3 probes per search")
    p.add_argument("--workloads", default=None, help="comma-separated traces (default: arxiv,sharegpt)")
    p.add_argument("--batches", default=None, help="llama.cpp -b values (default: 32,64,256,2048)")
    p.add_argument("--num-requests", type=int, default=None, help="requests per probe (default 64; quick 48)")
    p.add_argument("--max-probes", type=int, default=None, help="probes per capacity search (6; quick 3)")
    p.add_argument("--retries", type=int, default=None, help="repeats of a disturbed probe (2; quick 1)")
    p.add_argument("--qps-start", type=float, default=None, help="default: power of 2 near sarathi's sim")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="a packaged model, e.g. gemma3-270m (default: SmolLM2)")
    p.add_argument(
        "--quantization",
        choices=["none", "gguf"],
        default="none",
        help="gguf: both serve the shipped GGUF's own blocks (sarathi --quantization gguf); none: BF16",
    )
    p.add_argument("--output-dir", default="vs_llama_cpp_results")
    p.add_argument("--no-save", action="store_true", help="do not write the JSON record")
    args = p.parse_args(argv)
    if args.num_requests is not None and args.num_requests < 48:
        p.error("--num-requests must be >= 48")
    args.workloads = (
        args.workloads.split(",") if args.workloads else list(QUICK_WORKLOADS if args.quick else WORKLOADS)
    )
    args.batches = (
        [int(b) for b in args.batches.split(",")]
        if args.batches
        else list(QUICK_LLAMA_BATCHES if args.quick else LLAMA_BATCHES)
    )
    args.num_requests = args.num_requests or (48 if args.quick else 64)
    args.max_probes = args.max_probes or (3 if args.quick else 6)
    args.retries = args.retries if args.retries is not None else (1 if args.quick else 2)
    return args


def settings_for(batches: Sequence[int], default_budget: int, tuned: dict[str, int]) -> list[ServerSetting]:
    """llama.cpp at every -b, then sarathi at its default budget and each tuned one (each setting once)."""
    out = [ServerSetting("llama.cpp", b) for b in batches]
    out += [ServerSetting("sarathi", b) for b in dict.fromkeys([default_budget, *tuned.values()])]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from sarathi.benchmark.workload import TokenSpace, generate_workload
    from sarathi.config import DEFAULT_TOKEN_BUDGET

    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ensure_llama_cpp()
    quantized = args.quantization == "gguf"
    gguf, folder = model_files(args.model, quantized)
    allowed = TokenSpace.of_folder(folder).allowed()
    all_results: list[SettingResult] = []
    comparison: dict[str, dict] = {}
    for trace in args.workloads:
        tuned, sims = tuned_budgets(trace, SLOS, args.seed, args.model)
        qps_start = args.qps_start or pow2_near(sims[SLOS[-1].label].get(str(DEFAULT_TOKEN_BUDGET), 1.0))
        search = SearchSettings(
            qps_start=qps_start, qps_min=0.05, qps_max=64.0, rel_tol=0.1, max_probes=args.max_probes
        )
        print(f"== {trace}: sarathi tuned budgets {tuned}; searches start at {qps_start:g} QPS", flush=True)
        results = []
        for setting in settings_for(args.batches, DEFAULT_TOKEN_BUDGET, tuned):
            port = free_port()
            cmd = server_command(setting, port, gguf, args.model, quantized)
            shown = " ".join([Path(cmd[0]).name, *cmd[1:]])
            print(f"-- {setting.label}: {shown}", flush=True)
            result = SettingResult(setting, trace)
            with RunningServer(
                cmd, port, out / "logs" / f"{trace}-{setting.label.replace(' ', '_')}.log"
            ) as srv:

                def measure(qps: float, srv=srv, trace=trace) -> ProbeRecord:
                    base = generate_workload(workload_config(trace, qps, args.num_requests, args.seed))

                    def make_requests(attempt: int, base=base, qps=qps) -> list:
                        return fresh_prompts(base, allowed, (args.seed, round(qps * 1e6), attempt))

                    rec = measure_probe(srv, make_requests, qps, args.retries)
                    flag = " DISTURBED" if rec.disturbed else ""
                    print(
                        f"   {qps:7.3g} QPS: TTFT p50 {rec.ttft_p50 * 1e3:6.0f}"
                        f" p99 {rec.ttft_p99 * 1e3:6.0f} ms"
                        f"  TBT p50 {rec.tbt_p50 * 1e3:5.0f} p99 {rec.tbt_p99 * 1e3:6.0f} ms"
                        f"  failed {rec.num_failed}  foreign load {rec.foreign_load:.0%}{flag}",
                        flush=True,
                    )
                    return rec

                capacity_searches(measure, SLOS, search, result)
            print(
                "   capacity: " + ", ".join(f"{k} {v:.3g} QPS" for k, v in result.capacity.items()),
                flush=True,
            )
            results.append(result)
        all_results += results
        comparison[trace] = compare(results, tuned, DEFAULT_TOKEN_BUDGET, sims, qps_start)
    disturbed = sum(p.disturbed for r in all_results for p in r.probes.values())
    print_report(comparison, all_results)
    plots = write_plots(comparison, all_results, out)
    if disturbed:
        print(
            f"WARNING: {disturbed} probe(s) ran with more than {MAX_FOREIGN_LOAD:.0%} foreign CPU load "
            "after their retries; their numbers are suspect (marked disturbed in the record)"
        )
    elapsed = time.monotonic() - started
    print(f"{elapsed / 60:.1f} min; plots: {', '.join(str(p) for p in plots)}")
    if not args.no_save:
        settings = {
            "args": vars(args),
            "slos": [dataclasses.asdict(s) for s in SLOS],
            "length_scale": LENGTH_SCALE,
            "max_total_tokens": MAX_TOTAL_TOKENS,
            "arrival": "poisson",
            "llama_cpp": {
                "llama_cpp_python_sdist": LLAMA_CPP_PYTHON_VERSION,
                "version": llama_cpp_version(),
                **build_info(),
                "server_flags": f"-t {LLAMA_THREADS} -np {LLAMA_PARALLEL} -c {LLAMA_CTX} --cache-ram 0 -cb"
                " -b B -ub min(B, 512)",
                "weights": gguf.name,
            },
            "sarathi": {
                "version": _sarathi_version(),
                "default_token_budget": DEFAULT_TOKEN_BUDGET,
                "quantization": args.quantization,
            },
            "comparison": comparison,
            "disturbed_probes": disturbed,
            "max_foreign_load": MAX_FOREIGN_LOAD,
            "elapsed_s": round(elapsed),
        }
        print(f"saved {save_result('vs-llama-cpp', [r.row() for r in all_results], settings)}")
    return 0


def _sarathi_version() -> str:
    from importlib.metadata import version

    return version("sarathi")


def compare(
    results: Sequence[SettingResult], tuned: dict[str, int], default_budget: int, sims: dict, qps_start: float
) -> dict:
    """Per SLO the compared rows (llama.cpp's best -b, sarathi default, sarathi tuned) with capacities, and
    the TTFT/TBT percentiles of those settings at every load all of them were probed at."""
    llama = [r for r in results if r.setting.server == "llama.cpp"]
    by_setting = {r.setting: r for r in results}
    per_slo, below, roles, compared = {}, {}, {}, {}
    for slo in SLOS:
        rows = {}
        if llama:
            rows["llama.cpp best"] = best_setting(llama, slo)
        rows["sarathi default"] = by_setting[ServerSetting("sarathi", default_budget)]
        rows["sarathi tuned"] = by_setting[ServerSetting("sarathi", tuned[slo.label])]
        per_slo[slo.label] = {role: r.capacity[slo.label] for role, r in rows.items()}
        below[slo.label] = {role: r.lowest_failing[slo.label] for role, r in rows.items()}
        roles[slo.label] = {role: r.setting.label for role, r in rows.items()}
        for r in rows.values():
            compared[r.setting.label] = r
    chosen = list(compared.values())
    loads = shared_loads(chosen)
    at_loads = {
        f"{q:g}": {
            r.setting.label: {
                k: r.probes[q].row()[k]
                for k in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "foreign_load", "disturbed")
            }
            for r in chosen
        }
        for q in loads
    }
    return {
        "capacity_qps": per_slo,
        "compared": roles,
        "lowest_failing_qps": below,
        "llama_cpp_capacity_qps": {r.setting.label: r.capacity for r in llama},
        "sarathi_tuned_budget": tuned,
        "sarathi_simulated_capacity_qps": sims,
        "qps_start": qps_start,
        "compared_settings": list(compared),
        "shared_loads": at_loads,
        "cdf_load_qps": cdf_load(chosen, SLOS[-1]),
    }


def capacity_text(capacity: float, lowest_failing: float | None) -> str:
    """'2.83', or '<1' when even the lowest load probed missed the SLO (the search ran out of probes)."""
    if capacity > 0 or lowest_failing is None:
        return f"{capacity:.3g}"
    return f"<{lowest_failing:.3g}"


def print_report(comparison: dict, results: Sequence[SettingResult]) -> None:
    for trace, c in comparison.items():
        print(f"\n=== {trace} (lengths x{LENGTH_SCALE:g}, <= {MAX_TOTAL_TOKENS} tokens, Poisson)")
        print("capacity (QPS): P99 TBT within the SLO, median TTFT <= 2 s")
        for slo, rows in c["capacity_qps"].items():
            below = c["lowest_failing_qps"][slo]
            print(
                f"  {slo}: "
                + "; ".join(
                    f"{role} ({c['compared'][slo][role]}) {capacity_text(cap, below[role])}"
                    for role, cap in rows.items()
                )
            )
        print(
            "  all llama.cpp settings: "
            + "; ".join(
                f"{label} " + "/".join(f"{v:.3g}" for v in caps.values())
                for label, caps in c["llama_cpp_capacity_qps"].items()
            )
        )
        print("at shared loads (ms): TTFT p50 / p99, TBT p50 / p99")
        for q, per in c["shared_loads"].items():
            print(f"  {q} QPS")
            for label, m in per.items():
                vals = " / ".join(
                    "-" if m[k] is None else f"{m[k] * 1e3:.0f}" for k in ("ttft_p50", "ttft_p99")
                )
                tbt = " / ".join("-" if m[k] is None else f"{m[k] * 1e3:.0f}" for k in ("tbt_p50", "tbt_p99"))
                flag = "  DISTURBED" if m["disturbed"] else ""
                print(f"    {label:<22} TTFT {vals:>13}   TBT {tbt:>11}{flag}")


def write_plots(comparison: dict, results: Sequence[SettingResult], out: Path) -> list[Path]:
    from sarathi.benchmark.plots import plot_capacity_bars, plot_cdf

    paths = []
    for trace, c in comparison.items():
        paths.append(plot_capacity_bars(c["capacity_qps"], out / f"capacity_bars_{trace}.png"))
        q = c["cdf_load_qps"]
        if q is None:
            continue
        stores = {
            r.setting.label: r.probes[q].store
            for r in results
            if r.workload == trace and r.setting.label in c["compared_settings"]
        }
        for metric in ("tbt", "ttft"):
            paths.append(
                plot_cdf(
                    stores,
                    metric,
                    out / f"{metric}_cdf_{trace}.png",
                    f"{metric.upper()} at {q:g} QPS ({trace})",
                )
            )
    return paths


if __name__ == "__main__":
    raise SystemExit(main())
