"""Executors: how the engine's steps reach the workers that hold the model (in-process, mp, Ray)."""

from __future__ import annotations

from sarathi.config import EngineConfig
from sarathi.engine.executor_base import Executor


def make_executor(config: EngineConfig, num_kv_blocks: int, eos_token_ids: tuple[int, ...]) -> Executor:
    """The executor ``config.parallel`` asks for, with its workers started and their shards loaded."""
    backend = config.parallel.backend
    if backend == "uniproc":
        from sarathi.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config, num_kv_blocks, eos_token_ids)
    if backend == "mp":
        from sarathi.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config, num_kv_blocks, eos_token_ids)
    if backend == "ray":
        from sarathi.executor.ray_executor import RayExecutor

        return RayExecutor(config, num_kv_blocks, eos_token_ids)
    raise ValueError(f"unknown executor backend {backend!r}")
