"""``sarathi bench``: replay a workload under one or more scheduler configs, in-process or against a server.

Writes into ``--output-dir``: ``summary.json`` (a list, one entry per config), per config a folder with
``requests.csv``, ``iterations.csv`` (in-process only), ``cdf.csv`` and its own ``summary.json``, and the
plots ``tbt_cdf.png``, ``ttft_cdf.png``, ``tokens_over_time.png`` and ``iteration_time_vs_tokens.png``.

``--trace chat`` replays multi-turn conversations instead (sarathi/benchmark/chat_workload.py): ``--qps``
is then the rate at which conversations start, and it runs in-process only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sarathi.benchmark.bench import (
    BenchConfig,
    BenchRun,
    format_table,
    run_one_in_process,
    summary_entry,
    write_results,
)
from sarathi.benchmark.chat_workload import ChatWorkloadConfig
from sarathi.benchmark.workload import (
    TokenSpace,
    WorkloadConfig,
    generate_workload,
)
from sarathi.config import DEFAULT_TOKEN_BUDGET
from sarathi.core.schedulers import SCHEDULERS
from sarathi.entrypoints.args import engine_config_from_args
from sarathi.entrypoints.build import build_engine
from sarathi.entrypoints.workload_args import (
    add_comparison_parser,
    add_workload_args,
    comparison_plan,
)


def resolve_token_budgets(args: argparse.Namespace) -> list[int | str]:
    """``--token-budget`` with ``auto`` replaced by the budget it chooses (printed with its reason) for the
    first chunking scheduler of ``--schedulers``; kept as ``auto`` against a live server (``--url``: the
    server chose its own), dropped where no scheduler uses a budget."""
    if getattr(args, "url", None):
        return list(args.token_budget)
    chunking = [s for s in args.schedulers if s in SCHEDULERS and SCHEDULERS[s].chunked_prefills]
    budgets: list[int | str] = []
    for b in args.token_budget:
        if b == "auto":
            if not chunking:
                b = DEFAULT_TOKEN_BUDGET
            else:
                ns = argparse.Namespace(**{**vars(args), "scheduler": chunking[0], "token_budget": "auto"})
                b = engine_config_from_args(ns).scheduler.token_budget
        budgets.append(b)
    return list(dict.fromkeys(budgets))


def add_parser(sub) -> argparse.ArgumentParser:
    p = add_comparison_parser(
        sub,
        "bench",
        "replay a workload under several schedulers and write metrics and plots",
        __doc__,
        ["sarathi"],
        auto_budget=True,
    )
    p.add_argument(
        "--qps",
        type=float,
        default=1.0,
        help="mean arrival rate; 0 = all at once (with --arrival trace: the trace's own timestamps)",
    )
    add_workload_args(p)
    p.add_argument("--url", default=None, help="benchmark a live server instead (e.g. http://host:8000)")
    p.add_argument("--output-dir", default="bench_results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    try:
        workload, configs, engine_configs = comparison_plan(args, lambda: resolve_token_budgets(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    progress = not args.no_progress
    runs = []
    try:
        if args.url:
            if len(configs) > 1:
                print(
                    "warning: --url benchmarks the server as it runs; only the first config is used",
                    file=sys.stderr,
                )
            runs.append(_run_url(args, workload, configs[0], progress))
        else:
            for config, ec in zip(configs, engine_configs, strict=True):
                engine = build_engine(ec)
                try:
                    runs.append(run_one_in_process(ec, workload, config, engine, progress))
                finally:
                    engine.shutdown()
                print(f"{config.label}: done", file=sys.stderr)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plots = write_results(runs, args.output_dir)
    print(format_table([r.summary for r in runs]))
    print(f"wrote {Path(args.output_dir) / 'summary.json'} and {len(plots)} plots")
    return 0


def _run_url(
    args, workload: WorkloadConfig | ChatWorkloadConfig, config: BenchConfig, progress: bool
) -> BenchRun:
    """Against a live server: prompts use the token space of ``--model`` (default: the embedded model),
    which must be the model the server runs. The server's own settings apply; the summary records the
    first of ``--schedulers`` / ``--token-budget`` as the caller's description of them."""
    from sarathi.benchmark.http_client import run_http

    if isinstance(workload, ChatWorkloadConfig):
        raise ValueError("the chat workload runs in-process only (each turn resends the exact answer tokens)")
    folder = args.model
    if folder is None:
        from sarathi.model import embedded_model_path

        folder = embedded_model_path()
    if not Path(folder, "config.json").is_file():
        raise ValueError(f"--url needs --model to be a model folder with config.json, got {folder}")
    requests = generate_workload(workload, TokenSpace.of_folder(folder))
    import httpx

    try:
        store, errors = run_http(args.url, requests, progress=progress, desc=args.url)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot use the server at {args.url}: {type(e).__name__}: {e}") from e
    for e in errors[:10]:
        print(f"warning: request failed: {e}", file=sys.stderr)
    entry = summary_entry(config, workload, store, "http")
    entry["url"] = args.url
    entry["num_failed"] = len(errors)
    entry["model"] = (
        args.model or "embedded SmolLM2-135M-Instruct"
    )  # its tokens; the server's dtype is its own
    return BenchRun(config, store, entry)
