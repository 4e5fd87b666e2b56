"""Flags shared by the commands that run a workload (``bench``, ``capacity``, ``simulate``, ``tune``): the
workload, the scheduler configs to compare and the simulation's latency model, mapped to their configs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from sarathi.benchmark.bench import CHAT, BenchConfig, bench_configs
from sarathi.benchmark.chat_workload import ChatWorkloadConfig
from sarathi.benchmark.workload import (
    ARRIVALS,
    BUILTIN_TRACES,
    LENGTH_DISTRIBUTIONS,
    SYNTHETIC,
    SyntheticLengths,
    WorkloadConfig,
    trace_path,
)
from sarathi.config import SCHEDULER_NAMES, EngineConfig
from sarathi.core.latency_model import LatencyModel
from sarathi.entrypoints.args import add_engine_args, engine_config_from_args
from sarathi.simulator.cluster import ROUTERS, simulation_config


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


def comparison_plan(
    args: argparse.Namespace, budgets: list[int | str] | Callable[[], list[int | str]]
) -> tuple[WorkloadConfig | ChatWorkloadConfig, list[BenchConfig], list[EngineConfig]]:
    """The workload at ``--qps`` (0: all at once), every scheduler x budget and their engine configs (none
    for an ``auto`` budget, which only a live server keeps: it chose its own); ValueError names a flag.
    ``budgets`` may be a callable, called once the workload's flags have been checked (choosing an ``auto``
    budget may profile the machine first: bad flags fail before that)."""
    workload = workload_config_from_args(args, None if args.qps == 0 else args.qps)
    configs = bench_configs(args.schedulers, budgets() if callable(budgets) else budgets)
    return workload, configs, [engine_config_for(args, c) for c in configs if c.token_budget != "auto"]


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


def add_simulation_args(p: argparse.ArgumentParser) -> None:
    """Latency-model and cluster flags shared by ``simulate`` and ``tune``."""
    g = p.add_argument_group("simulation")
    g.add_argument(
        "--profile",
        default=None,
        help="latency model JSON from `sarathi profile` (default: this machine's cached profile)",
    )
    g.add_argument("--hardware", default=None, help="simulate a GPU instead (e.g. a100, h100)")
    g.add_argument(
        "--model-spec", default=None, help="with --hardware: a paper model (e.g. yi-34b) or a config.json"
    )
    g.add_argument(
        "--gpus-per-node", type=int, default=None, help="with --hardware: GPUs per node (default 8)"
    )
    g.add_argument("--num-replicas", type=int, default=1, help="engines behind the router")
    g.add_argument("--router", default="round_robin", choices=ROUTERS)


def resolve_simulation(args: argparse.Namespace, config: EngineConfig) -> tuple[EngineConfig, LatencyModel]:
    """The weight-free engine config and the latency model the flags ask for (ValueError names a problem)."""
    if args.num_replicas < 1:
        raise ValueError(f"--num-replicas must be >= 1, got {args.num_replicas}")
    if args.hardware or args.model_spec:
        if not (args.hardware and args.model_spec):
            raise ValueError("--hardware and --model-spec go together")
        from sarathi.simulator.gpu import gpu_simulation

        return gpu_simulation(config, args.model_spec, args.hardware, args.gpus_per_node)
    from sarathi.simulator.measured import MeasuredLatencyModel

    sim_config = simulation_config(config)
    if args.profile:
        model = MeasuredLatencyModel.load(args.profile)
    else:
        from sarathi.simulator.machine_profile import machine_latency_model

        model = machine_latency_model(config, progress=not getattr(args, "no_progress", False))
    pp = config.parallel.pipeline_parallel_size
    if model.num_stages != pp:
        raise ValueError(f"the latency profile has {model.num_stages} pipeline stages, the config {pp}")
    return sim_config, model
