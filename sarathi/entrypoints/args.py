"""Command-line flags for the engine (shared by every entry point) and their mapping to EngineConfig."""

from __future__ import annotations

import argparse

from sarathi.config import (
    COMPUTE_DTYPES,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_TOKEN_BUDGET,
    DTYPES,
    EXECUTOR_BACKENDS,
    LOAD_FORMATS,
    QUANTIZATIONS,
    SCHEDULER_NAMES,
    ChunkSchedule,
    EngineConfig,
    engine_config,
)


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add model, KV cache and scheduler flags to ``parser``."""
    m = parser.add_argument_group("model")
    m.add_argument(
        "--model", default=None, help="HF checkpoint folder or .gguf file (default: embedded SmolLM2)"
    )
    m.add_argument("--load-format", default="auto", choices=LOAD_FORMATS)
    m.add_argument(
        "--dtype", default="bfloat16", choices=DTYPES, help="weights and KV cache (float32: exact, slower)"
    )
    m.add_argument(
        "--compute-dtype",
        default="auto",
        choices=COMPUTE_DTYPES,
        help="matmul arithmetic: bfloat16 (bf16 inputs, fp32 accumulation; needs --dtype bfloat16), float32, "
        "or auto (bfloat16 where our AVX512-BF16 kernel runs, else float32)",
    )
    m.add_argument(
        "--quantization",
        default="none",
        choices=QUANTIZATIONS,
        help="gguf: serve a GGUF file's quantized layers in its own bytes (bf16 activations, fp32 sums); "
        "int8 / int4: quantize the linear layers at load (groups of 32); none: weights in --dtype",
    )
    m.add_argument("--max-model-len", type=int, default=None)
    m.add_argument("--seed", type=int, default=0)

    c = parser.add_argument_group("KV cache")
    c.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    c.add_argument("--num-kv-blocks", type=int, default=None, help="KV pool size in blocks")
    c.add_argument("--kv-cache-memory", type=float, default=None, help="KV pool size in GiB (default 2)")
    c.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV of full blocks of prompts seen before (default: on)",
    )

    s = parser.add_argument_group("scheduler")
    s.add_argument("--scheduler", default="sarathi", help=f"one of: {', '.join(SCHEDULER_NAMES)}")
    s.add_argument(
        "--token-budget",
        type=token_budget_arg,
        default=DEFAULT_TOKEN_BUDGET,
        help="tokens per iteration, or 'auto': chosen for --tbt-slo by simulation on this machine's "
        "latency profile (measured once, then cached)",
    )
    s.add_argument(
        "--tbt-slo",
        type=float,
        default=None,
        help="P99 time between tokens (s) for --token-budget auto (default: 5x this machine's one-sequence "
        "decode iteration) and --adaptive-budget",
    )
    s.add_argument(
        "--adaptive-budget",
        action="store_true",
        help="sarathi: size each iteration to the decodes' slack to --tbt-slo (--token-budget is the cap)",
    )
    s.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    s.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="prompt tokens per batch (vllm/orca/ft)"
    )
    s.add_argument("--low-chunk-size", type=int, default=None, help="enables the dynamic chunk schedule")
    s.add_argument("--high-chunk-size", type=int, default=None, help="default: the token budget")
    s.add_argument("--chunk-schedule-stages", type=int, default=4)
    s.add_argument("--chunk-schedule-tokens-per-stage", type=int, default=512)

    d = parser.add_argument_group("parallelism")
    d.add_argument(
        "--tensor-parallel-size", "-tp", type=int, default=1, help="worker processes splitting each layer"
    )
    d.add_argument(
        "--pipeline-parallel-size", "-pp", type=int, default=1, help="pipeline stages (worker processes)"
    )
    d.add_argument(
        "--distributed-executor-backend",
        default=None,
        choices=EXECUTOR_BACKENDS,
        help="mp: worker processes on this machine (default for more than one rank); ray: Ray actors",
    )
    return parser


def token_budget_arg(text: str) -> int | str:
    """``--token-budget``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


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
    schedule = None
    if args.low_chunk_size is not None:
        schedule = ChunkSchedule(
            low_chunk_size=args.low_chunk_size,
            high_chunk_size=args.high_chunk_size or token_budget,
            num_stages=args.chunk_schedule_stages,
            tokens_per_stage=args.chunk_schedule_tokens_per_stage,
        )
    return engine_config(
        args.model,
        load_format=args.load_format,
        dtype=args.dtype,
        compute_dtype=args.compute_dtype,
        quantization=args.quantization,
        max_model_len=args.max_model_len,
        seed=args.seed,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_gib=args.kv_cache_memory,
        enable_prefix_caching=args.enable_prefix_caching,
        scheduler=args.scheduler,
        token_budget=token_budget,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        chunk_schedule=schedule,
        adaptive_tbt_slo=_adaptive_slo(args),
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        distributed_executor_backend=args.distributed_executor_backend,
    )
