"""Simulating a GPU deployment: the paper's models on A100/H100-class GPUs through the analytic model.

The engine sees the model's real shapes (vocabulary, context, KV heads) without weights, a KV pool sized as
vLLM sizes one on that GPU, and the analytic latency model for its tensor/pipeline layout.
"""

from __future__ import annotations

import dataclasses

from sarathi.config import EngineConfig
from sarathi.simulator.analytic import AnalyticLatencyModel
from sarathi.simulator.hardware import HARDWARE, get_hardware
from sarathi.simulator.model_spec import ModelSpec, kv_cache_blocks

ALIASES = {"a100": "a100-80gb", "h100": "h100-80gb"}


def hardware_by_name(name: str, gpus_per_node: int | None = None):
    """A hardware preset by its name or a short alias (``a100``, ``h100``)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in HARDWARE:
        names = ", ".join([*ALIASES, *HARDWARE])
        raise ValueError(f"unknown hardware {name!r} (choose from {names})")
    return get_hardware(key, gpus_per_node)


def gpu_simulation(
    config: EngineConfig, model_spec: str, hardware: str, gpus_per_node: int | None = None
) -> tuple[EngineConfig, AnalyticLatencyModel]:
    """``config`` (its scheduler, block size and parallel layout) for ``model_spec`` on ``hardware``:
    the weight-free engine config and the analytic latency model."""
    spec = ModelSpec.load(model_spec)
    hw = hardware_by_name(hardware, gpus_per_node)
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    blocks = config.cache.num_kv_blocks or kv_cache_blocks(spec, hw, tp, pp, config.cache.block_size)
    if blocks < 1:
        raise ValueError(
            f"{spec.name} does not fit {tp * pp} x {hw.name} at tensor_parallel_size={tp}, "
            f"pipeline_parallel_size={pp}: no memory is left for the KV cache"
        )
    model = dataclasses.replace(
        config.model,
        model=None,
        load_format="dummy",
        hf_config=spec.engine_hf_config(),
        dtype="bfloat16",
        compute_dtype="bfloat16",
    )
    cache = dataclasses.replace(config.cache, num_kv_blocks=blocks)
    sim_config = dataclasses.replace(config, model=model, cache=cache)
    return sim_config, AnalyticLatencyModel(spec, hw, tp, pp)
