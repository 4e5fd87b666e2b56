"""Typed, validated configuration for the engine. Pure Python: the simulator uses the same objects."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

SCHEDULER_NAMES = ("sarathi", "vllm", "orca", "faster_transformer", "simple_chunking")

# Chosen for the 2-core CPU this project targets: a linear layer's cost is flat only up to ~8-16 tokens and
# grows linearly after, so the budget trades time-between-tokens against throughput. On the demo workload
# (SmolLM2-135M, bf16 default) 64 is the largest budget whose P99 TBT stays well inside 100 ms (README).
DEFAULT_TOKEN_BUDGET = 64
DEFAULT_MAX_NUM_SEQS = 128
DEFAULT_KV_CACHE_MEMORY_GIB = 2.0
DTYPES = ("auto", "float32", "bfloat16")
COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
EXECUTOR_BACKENDS = ("mp", "ray")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
QUANTIZATIONS = ("auto", "none", "gguf", "int8", "int4")


def knob(
    default: Any, help: str, *, keyword: str | None = None, flags: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """A config field that is also an engine flag (``sarathi.entrypoints.args`` adds and reads it).

    ``keyword`` is its ``engine_config`` keyword and flag name where not the field's name, ``flags`` its
    option strings where not ``--keyword``; ``help`` and ``kwargs`` (type, choices, action) go to argparse.
    """
    return field(
        default=default, metadata={"keyword": keyword, "flags": flags, "argparse": {"help": help, **kwargs}}
    )


def keyword(f: Field) -> str:
    """A section field's ``engine_config`` keyword (its flag is ``--keyword`` unless it names its own)."""
    return f.metadata.get("keyword") or f.name


def token_budget_arg(text: str) -> int | str:
    """``--token-budget``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


@dataclass(frozen=True)
class ChunkSchedule:
    """Dynamic chunk sizes: a long prompt's chunks shrink from ``high`` to ``low`` as it progresses.

    The chunk size used for a prompt with ``p`` tokens already computed is stage ``p // tokens_per_stage``
    (capped at the last) of ``num_stages`` sizes spaced linearly from ``high_chunk_size`` down to
    ``low_chunk_size``. Later chunks attend to more keys and cost more, so shrinking them keeps the
    iteration time near-uniform.
    """

    low_chunk_size: int = knob(MISSING, "enables the dynamic chunk schedule", type=int)
    high_chunk_size: int = knob(MISSING, "default: the token budget", type=int)
    num_stages: int = knob(4, "chunk sizes from high to low", flags=("--chunk-schedule-stages",), type=int)
    tokens_per_stage: int = knob(
        512, "prompt tokens per chunk size", flags=("--chunk-schedule-tokens-per-stage",), type=int
    )

    def __post_init__(self) -> None:
        if not 1 <= self.low_chunk_size <= self.high_chunk_size:
            raise ValueError(
                f"chunk schedule needs 1 <= low_chunk_size <= high_chunk_size, "
                f"got low={self.low_chunk_size} high={self.high_chunk_size}"
            )
        if self.num_stages < 1:
            raise ValueError(f"chunk schedule num_stages must be >= 1, got {self.num_stages}")
        if self.tokens_per_stage < 1:
            raise ValueError(f"chunk schedule tokens_per_stage must be >= 1, got {self.tokens_per_stage}")

    @property
    def chunk_sizes(self) -> list[int]:
        if self.num_stages == 1:
            return [self.high_chunk_size]
        step = (self.high_chunk_size - self.low_chunk_size) / (self.num_stages - 1)
        return [round(self.high_chunk_size - i * step) for i in range(self.num_stages)]

    def chunk_size(self, num_computed_tokens: int) -> int:
        """Chunk size for a prompt that has ``num_computed_tokens`` tokens in the KV cache."""
        sizes = self.chunk_sizes
        return sizes[min(num_computed_tokens // self.tokens_per_stage, len(sizes) - 1)]


@dataclass(frozen=True)
class SchedulerConfig:
    """Which batching policy to run and its limits.

    ``token_budget`` bounds the tokens of one iteration for the chunking schedulers (sarathi,
    simple_chunking). ``max_num_batched_tokens`` bounds a batch of whole prompts for the others
    (vllm, orca, faster_transformer); None means the model's max length.
    """

    name: str = knob("sarathi", f"one of: {', '.join(SCHEDULER_NAMES)}", keyword="scheduler")
    token_budget: int = knob(
        DEFAULT_TOKEN_BUDGET,
        "tokens per iteration, or 'auto': chosen for --tbt-slo by simulation on this machine's "
        "latency profile (measured once, then cached)",
        type=token_budget_arg,
    )
    max_num_seqs: int = knob(DEFAULT_MAX_NUM_SEQS, "sequences running at once", type=int)
    max_num_batched_tokens: int | None = knob(None, "prompt tokens per batch (vllm/orca/ft)", type=int)
    chunk_schedule: ChunkSchedule | None = None
    #: With a value (seconds), the sarathi scheduler sets each iteration's budget (at most
    #: ``token_budget``) from the running decodes' slack to this P99 TBT target and a latency model.
    adaptive_tbt_slo: float | None = None

    def __post_init__(self) -> None:
        if self.adaptive_tbt_slo is not None:
            if not self.adaptive_tbt_slo > 0:
                raise ValueError(f"adaptive_tbt_slo must be > 0 seconds, got {self.adaptive_tbt_slo}")
            if self.name != "sarathi":
                raise ValueError(f"the adaptive token budget needs the sarathi scheduler, not {self.name!r}")
        if self.name not in SCHEDULER_NAMES:
            raise ValueError(f"unknown scheduler {self.name!r}; choose one of: {', '.join(SCHEDULER_NAMES)}")
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: block size, pool size (a block count, or a memory budget in GiB) and whether full
    blocks are reused across requests that share a prefix (automatic prefix caching)."""

    block_size: int = knob(16, "tokens per KV block", type=int)
    num_kv_blocks: int | None = knob(None, "KV pool size in blocks", type=int)
    kv_cache_memory_gib: float | None = knob(
        None,
        f"KV pool size in GiB (default {DEFAULT_KV_CACHE_MEMORY_GIB:g})",
        flags=("--kv-cache-memory",),
        type=float,
    )
    watermark: float = 0.01
    enable_prefix_caching: bool = knob(
        True,
        "reuse the KV of full blocks of prompts seen before (default: on)",
        action=argparse.BooleanOptionalAction,
    )

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.num_kv_blocks is not None and self.kv_cache_memory_gib is not None:
            raise ValueError("give either num_kv_blocks or kv_cache_memory_gib, not both")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")


@dataclass(frozen=True)
class ModelConfig:
    """Which weights to load and how.

    ``model`` is a Hugging Face checkpoint folder, a .gguf file, or None for the embedded SmolLM2-135M.
    ``load_format`` is 'auto', 'safetensors', 'gguf' or 'dummy' (random weights for the folder's config or
    ``hf_config``). ``max_model_len`` None means the model's own maximum. ``dtype`` is what weights and the
    KV cache are stored in: 'auto' (the default) is bfloat16 with a GGUF file's quantized layers kept in
    their bytes, 'bfloat16' every weight in bf16 (a GGUF file dequantized), 'float32' the exact setting.
    ``compute_dtype`` is what matmuls compute in: float32, or bfloat16 with bfloat16 weights (bf16 inputs,
    float32 accumulation: 2-3x faster, within 1.3x of that scheme's rounding floor), or 'auto' (bfloat16
    where our bf16 kernel runs, else float32). ``quantization`` (vLLM's names): 'auto' (the default) is
    'gguf' for a GGUF model (the embedded and packaged ones included) with ``dtype`` 'auto' where our
    kernels run, else 'none'; 'gguf' keeps a GGUF file's quantized linear layers in the file's bytes (the
    file's exact weights times bf16 or two-term int8 activations, float32 sums); 'int8' / 'int4' quantize
    any checkpoint's linear layers at load (groups of 32: int8 with a scale, as GGUF Q8_0; int4 with a
    scale and an offset, as Q4_1); 'none' keeps (or dequantizes to) ``dtype``.
    """

    model: str | None = knob(None, "HF checkpoint folder or .gguf file (default: embedded SmolLM2)")
    load_format: str = knob(
        "auto",
        "auto (by path: .gguf, else a safetensors folder), or dummy (random weights for a config)",
        choices=LOAD_FORMATS,
    )
    dtype: str = knob(
        "auto",
        "weights and KV cache: auto (bfloat16, a GGUF file's quantized layers kept in their bytes), "
        "bfloat16 (every weight in bf16, GGUF dequantized), float32 (exact, slower)",
        choices=DTYPES,
    )
    compute_dtype: str = knob(
        "auto",
        "matmul arithmetic: bfloat16 (bf16 inputs, fp32 accumulation; needs --dtype bfloat16), float32, "
        "or auto (bfloat16 where our AVX512-BF16 kernel runs, else float32)",
        choices=COMPUTE_DTYPES,
    )
    quantization: str = knob(
        "auto",
        "auto: gguf for a GGUF model (the embedded one included) with --dtype auto, else none; "
        "gguf: serve a GGUF file's quantized layers in its own bytes (fp32 sums); "
        "int8 / int4: quantize the linear layers at load (groups of 32); none: weights in --dtype",
        choices=QUANTIZATIONS,
    )
    max_model_len: int | None = knob(
        None, "prompt plus output tokens (default: the model's maximum)", type=int
    )
    seed: int = knob(0, "seed of the sampler and of dummy weights", type=int)
    hf_config: dict | None = None

    def __post_init__(self) -> None:
        if self.load_format not in LOAD_FORMATS:
            choices = ", ".join(LOAD_FORMATS)
            raise ValueError(f"unknown load_format {self.load_format!r}; choose one of: {choices}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of: {', '.join(DTYPES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"unknown compute_dtype {self.compute_dtype!r}; choose one of: {', '.join(COMPUTE_DTYPES)}"
            )
        if self.compute_dtype == "bfloat16" and self.dtype == "float32":
            raise ValueError("compute_dtype 'bfloat16' needs dtype 'bfloat16' (bf16 math reads bf16 weights)")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"unknown quantization {self.quantization!r}; choose one of: {', '.join(QUANTIZATIONS)}"
            )
        quantized = self.quantization not in ("auto", "none")
        if quantized and (self.dtype == "float32" or self.compute_dtype == "float32"):
            raise ValueError(
                f"quantization {self.quantization!r} uses bf16 activations: it needs dtype 'bfloat16'"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")

    @property
    def storage_dtype(self) -> str:
        """The dtype the weights (those not kept quantized) and the KV cache are stored in."""
        return "bfloat16" if self.dtype == "auto" else self.dtype


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is split over worker processes (vLLM's names).

    ``tensor_parallel_size`` ranks split every layer's heads and MLP columns; ``pipeline_parallel_size``
    stages each hold a contiguous share of the layers, with up to that many micro-batches in flight.
    ``distributed_executor_backend`` is 'mp' (worker processes on this machine) or 'ray' (Ray actors,
    possibly on several nodes); None runs a single-rank model in the engine's own process and means 'mp'
    for more than one rank.
    """

    tensor_parallel_size: int = knob(
        1, "worker processes splitting each layer", flags=("--tensor-parallel-size", "-tp"), type=int
    )
    pipeline_parallel_size: int = knob(
        1, "pipeline stages (worker processes)", flags=("--pipeline-parallel-size", "-pp"), type=int
    )
    distributed_executor_backend: str | None = knob(
        None,
        "mp: worker processes on this machine (default for more than one rank); ray: Ray actors",
        choices=EXECUTOR_BACKENDS,
    )

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ValueError(
                f"unknown distributed_executor_backend {backend!r}; "
                f"choose one of: {', '.join(EXECUTOR_BACKENDS)}"
            )

    @property
    def world_size(self) -> int:
        """Worker processes: tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def backend(self) -> str:
        """The executor that runs the workers: 'uniproc' (in the engine's process), 'mp' or 'ray'."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "uniproc" if self.world_size == 1 else "mp"


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs: model, KV cache, scheduler and parallelism settings."""

    model: ModelConfig = field(default_factory=ModelConfig, metadata={"title": "model"})
    cache: CacheConfig = field(default_factory=CacheConfig, metadata={"title": "KV cache"})
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata={"title": "scheduler"})
    parallel: ParallelConfig = field(default_factory=ParallelConfig, metadata={"title": "parallelism"})


def engine_config(model: str | None = None, **settings: Any) -> EngineConfig:
    """Build a validated EngineConfig from flat keyword arguments, one per section field (``keyword``);
    the offline API and the CLI use this."""
    settings["model"] = model
    sections = {}
    for section in fields(EngineConfig):
        cls = section.default_factory
        kwargs = {f.name: settings.pop(keyword(f)) for f in fields(cls) if keyword(f) in settings}
        sections[section.name] = cls(**kwargs)
    if settings:
        raise TypeError(f"engine_config() got unexpected keyword arguments: {', '.join(settings)}")
    return EngineConfig(**sections)
