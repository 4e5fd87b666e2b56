"""Command-line flags for the engine (shared by every entry point) and their mapping to EngineConfig.

The flags come from the config sections' fields declared with ``sarathi.config.knob``: a new knob is one
field there plus its use, no edit here.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, fields
from typing import Any

from sarathi.config import DEFAULT_TOKEN_BUDGET, ChunkSchedule, EngineConfig, engine_config, keyword

# Section fields without a flag of their own: an HF config dict (offline API only), an internal constant, and
# the two that the explicit flags below build (the chunk schedule group, --adaptive-budget with --tbt-slo).
NOT_FLAGS = frozenset({"hf_config", "watermark", "chunk_schedule", "adaptive_tbt_slo"})


def add_config_args(group: Any, cls: type) -> None:
    """Add a flag to ``group`` (a parser or argument group) for each ``knob`` field of dataclass ``cls``."""
    for f in fields(cls):
        if "argparse" in f.metadata:
            default = None if f.default is MISSING else f.default
            group.add_argument(*_options(f), default=default, **f.metadata["argparse"])


def config_args(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The values of ``cls``'s flags in ``args``, by ``engine_config`` keyword."""
    return {keyword(f): getattr(args, _dest(f)) for f in fields(cls) if "argparse" in f.metadata}


def _options(f: Field) -> tuple[str, ...]:
    return f.metadata["flags"] or ("--" + keyword(f).replace("_", "-"),)


def _dest(f: Field) -> str:
    return _options(f)[0].removeprefix("--").replace("-", "_")


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add model, KV cache, scheduler and parallelism flags to ``parser``."""
    for section in fields(EngineConfig):
        group = parser.add_argument_group(section.metadata["title"])
        add_config_args(group, section.default_factory)
        if section.name == "scheduler":  # flags that are not one field each: see _engine_config
            _add_budget_args(group)
            add_config_args(group, ChunkSchedule)
    return parser


def _add_budget_args(group: Any) -> None:
    group.add_argument(
        "--tbt-slo",
        type=float,
        default=None,
        help="P99 time between tokens (s) for --token-budget auto (default: 5x this machine's one-sequence "
        "decode iteration) and --adaptive-budget",
    )
    group.add_argument(
        "--adaptive-budget",
        action="store_true",
        help="sarathi: size each iteration to the decodes' slack to --tbt-slo (--token-budget is the cap)",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build a validated EngineConfig from parsed flags (ValueError names a bad flag value).

    ``--token-budget auto`` chooses the budget for ``--tbt-slo`` (default: the paper's strict SLO on this
    machine) by simulation on this machine's latency profile (profiling once, caching profile and choice)
    and prints the choice and its reason; schedulers without a token budget get the default.
    """
    if args.token_budget == "auto":
        from sarathi.simulator.auto_budget import auto_token_budget

        budget = auto_token_budget(_engine_config(args, DEFAULT_TOKEN_BUDGET), getattr(args, "tbt_slo", None))
        return _engine_config(args, budget)
    return _engine_config(args, args.token_budget)


def _adaptive_slo(args: argparse.Namespace) -> float | None:
    if not getattr(args, "adaptive_budget", False):
        return None
    if getattr(args, "tbt_slo", None) is None:
        raise ValueError("--adaptive-budget needs --tbt-slo SECONDS")
    return args.tbt_slo


def _engine_config(args: argparse.Namespace, token_budget: int) -> EngineConfig:
    settings = {k: v for s in fields(EngineConfig) for k, v in config_args(args, s.default_factory).items()}
    schedule = None
    if args.low_chunk_size is not None:  # the chunk schedule's high end defaults to the budget
        chunks = config_args(args, ChunkSchedule)
        schedule = ChunkSchedule(**{**chunks, "high_chunk_size": args.high_chunk_size or token_budget})
    settings.update(token_budget=token_budget, chunk_schedule=schedule, adaptive_tbt_slo=_adaptive_slo(args))
    return engine_config(**settings)
