"""The batching policies, chosen by ``SchedulerConfig.name``."""

from __future__ import annotations

from sarathi.config import SCHEDULER_NAMES, SchedulerConfig
from sarathi.core.block_manager import BlockManager
from sarathi.core.schedulers.base import Scheduler
from sarathi.core.schedulers.faster_transformer import FasterTransformerScheduler
from sarathi.core.schedulers.orca import OrcaScheduler
from sarathi.core.schedulers.sarathi import SarathiScheduler
from sarathi.core.schedulers.simple_chunking import SimpleChunkingScheduler
from sarathi.core.schedulers.vllm import VLLMScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    "sarathi": SarathiScheduler,
    "vllm": VLLMScheduler,
    "orca": OrcaScheduler,
    "faster_transformer": FasterTransformerScheduler,
    "simple_chunking": SimpleChunkingScheduler,
}


def make_scheduler(config: SchedulerConfig, block_manager: BlockManager, max_model_len: int) -> Scheduler:
    """The scheduler named by ``config.name``."""
    cls = SCHEDULERS.get(config.name)
    if cls is None:
        raise ValueError(f"unknown scheduler {config.name!r}; choose one of: {', '.join(SCHEDULER_NAMES)}")
    return cls(config, block_manager, max_model_len)


def max_step_tokens(config: SchedulerConfig) -> int | None:
    """The most tokens of one sequence in one step under ``config``: the token budget for the chunking
    policies, ``max_num_batched_tokens`` for the others (None: a whole prompt, unbounded)."""
    if SCHEDULERS[config.name].chunked_prefills:
        return config.token_budget
    return config.max_num_batched_tokens


__all__ = [
    "SCHEDULERS",
    "FasterTransformerScheduler",
    "OrcaScheduler",
    "SarathiScheduler",
    "Scheduler",
    "SimpleChunkingScheduler",
    "VLLMScheduler",
    "make_scheduler",
    "max_step_tokens",
]
