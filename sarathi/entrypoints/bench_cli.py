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
    CHAT,
    BenchConfig,
    BenchRun,
    bench_configs,
    format_table,
    run_one_in_process,
    summary_entry,
    write_results,
)
from sarathi.benchmark.chat_workload import ChatWorkloadConfig
from sarathi.benchmark.workload import (
    ARRIVALS,
    BUILTIN_TRACES,
    LENGTH_DISTRIBUTIONS,
    SYNTHETIC,
    SyntheticLengths,
    TokenSpace,
    WorkloadConfig,
    generate_workload,
    trace_path,
)
from sarathi.config import DEFAULT_TOKEN_BUDGET, SCHEDULER_NAMES, EngineConfig
from sarathi.core.schedulers import SCHEDULERS
from sarathi.entrypoints.args import add_engine_args, engine_config_from_args
from sarathi.entrypoints.build import build_engine


def csv_list(kind):
    """An argparse type: a comma-separated list of ``kind``."""

    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list: {e}") from e

    return parse


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """Workload flags shared by ``bench`` and ``capacity``."""
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--trace",
        default="sharegpt",
        help=f"a CSV path or one of: {', '.join([*BUILTIN_TRACES, SYNTHETIC, CHAT])}",
    )
    w.add_argument("--num-requests", type=int, default=64)
    w.add_argument("--arrival", default="poisson", choices=ARRIVALS)
    w.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of gamma arrivals")
    w.add_argument("--length-scale", type=float, default=1.0, help="multiply trace lengths by this")
    w.add_argument("--max-total-tokens", type=int, default=2048, help="cap on prompt + output tokens")
    w.add_argument("--length-dist", default="fixed", choices=LENGTH_DISTRIBUTIONS, help="synthetic lengths")
    w.add_argument(
        "--prompt-len", type=csv_list(int), default=[256], help="synthetic prompt length: N or MIN,MAX"
    )
    w.add_argument(
        "--output-len", type=csv_list(int), default=[64], help="synthetic output length: N or MIN,MAX"
    )
    w.add_argument("--zipf-theta", type=float, default=1.1)
    c = parser.add_argument_group("chat workload (--trace chat; answers are --output-len long)")
    c.add_argument("--conversations", type=int, default=16, help="number of conversations")
    c.add_argument("--turns", type=csv_list(int), default=[2, 6], help="turns per conversation: N or MIN,MAX")
    c.add_argument("--system-prompt-len", type=int, default=256, help="tokens of the shared system prompt")
    c.add_argument("--user-len", type=csv_list(int), default=[16, 64], help="user message: N or MIN,MAX")
    c.add_argument("--think-time", type=float, default=2.0, help="mean seconds between turns (exponential)")


def _min_max(values: list[int], name: str) -> tuple[int, int]:
    if len(values) not in (1, 2):
        raise ValueError(f"--{name} takes N or MIN,MAX, got {values}")
    return values[0], values[-1]


def workload_config_from_args(
    args: argparse.Namespace, qps: float | None
) -> WorkloadConfig | ChatWorkloadConfig:
    """A validated workload config from the workload flags (ValueError names a bad value)."""
    p_lo, p_hi = _min_max(args.prompt_len, "prompt-len")
    o_lo, o_hi = _min_max(args.output_len, "output-len")
    if args.trace == CHAT:
        t_lo, t_hi = _min_max(args.turns, "turns")
        u_lo, u_hi = _min_max(args.user_len, "user-len")
        return ChatWorkloadConfig(
            num_conversations=args.conversations,
            min_turns=t_lo,
            max_turns=t_hi,
            system_prompt_len=args.system_prompt_len,
            user_min=u_lo,
            user_max=u_hi,
            output_min=o_lo,
            output_max=o_hi,
            think_time=args.think_time,
            qps=qps,
            max_total_tokens=args.max_total_tokens,
            seed=args.seed,
        )
    if args.trace != SYNTHETIC:
        trace_path(args.trace)  # fail before loading any model
    return WorkloadConfig(
        trace=args.trace,
        num_requests=args.num_requests,
        qps=qps,
        arrival=args.arrival,
        cv=args.cv,
        length_scale=args.length_scale,
        max_total_tokens=args.max_total_tokens,
        seed=args.seed,
        synthetic=SyntheticLengths(args.length_dist, p_lo, p_hi, o_lo, o_hi, args.zipf_theta),
    )


def engine_config_for(args: argparse.Namespace, config: BenchConfig) -> EngineConfig:
    ns = argparse.Namespace(
        **{**vars(args), "scheduler": config.scheduler, "token_budget": config.token_budget}
    )
    return engine_config_from_args(ns)


def add_comparison_parser(
    sub,
    name: str,
    help: str,
    description: str | None,
    default_schedulers: list[str],
    auto_budget: bool = False,
) -> argparse.ArgumentParser:
    """A subcommand that runs one workload under several scheduler configs: engine flags (with
    ``--scheduler`` widened to a list), ``--token-budget`` list and ``--seed``. With ``auto_budget`` the
    list may hold ``auto`` (``resolve_token_budgets``), its default."""
    p = sub.add_parser(
        name,
        help=help,
        description=description,
        conflict_handler="resolve",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_args(p)
    p.add_argument(
        "--schedulers",
        "--scheduler",
        dest="schedulers",
        type=csv_list(str),
        default=default_schedulers,
        help=f"comma-separated, from: {', '.join(SCHEDULER_NAMES)}",
    )
    if auto_budget:
        p.add_argument(
            "--token-budget",
            type=csv_list(_budget_item),
            default=["auto"],
            help="token budget(s), comma-separated; 'auto' (default): chosen for --tbt-slo (default: 5x "
            "this machine's one-sequence decode iteration) on this machine's latency profile",
        )
    else:
        p.add_argument(
            "--token-budget", type=csv_list(int), default=[64], help="token budget(s), comma-separated"
        )
    p.add_argument("--seed", type=int, default=0, help="workload (and model) seed")
    return p


def _budget_item(text: str) -> int | str:
    return "auto" if text.strip() == "auto" else int(text)


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
        qps = None if args.qps == 0 else args.qps
        workload = workload_config_from_args(args, qps)
        configs = bench_configs(args.schedulers, resolve_token_budgets(args))
        # ("auto" stays only against a live server, whose engine is not built here.)
        engine_configs = [engine_config_for(args, c) for c in configs if c.token_budget != "auto"]
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
