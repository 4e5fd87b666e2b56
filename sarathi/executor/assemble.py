"""Assembling an engine: the model's facts from its checkpoint, the KV pool's size, then the executor.

Every engine is built here: the entry points through ``sarathi.entrypoints.build`` (which adds the budget
policy), the profiler with real workers, the simulator with its simulated executor and clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sarathi.config import EngineConfig
from sarathi.core.schedulers.base import BudgetController
from sarathi.engine.executor_base import Executor
from sarathi.engine.llm_engine import LLMEngine
from sarathi.executor import make_executor
from sarathi.model.kv_cache import kv_blocks_for
from sarathi.model.resolve import model_info, resolve_model
from sarathi.tokenizer import Tokenizer


def assemble_engine(
    config: EngineConfig,
    *,
    budget_controller: BudgetController | None = None,
    executor_factory: Callable[[EngineConfig, int, tuple[int, ...]], Executor] = make_executor,
    clock: Callable[[], float] = time.monotonic,
) -> LLMEngine:
    """An ``LLMEngine`` for ``config``; its executor starts last, once the configuration proved valid."""
    mc = config.model
    resolved = resolve_model(mc.model, mc.load_format, mc.hf_config)
    tokenizer = Tokenizer(resolved.tokenizer_dir) if resolved.tokenizer_dir else None
    return LLMEngine(
        config,
        model_info(resolved, tokenizer),
        tokenizer=tokenizer,
        num_kv_blocks=kv_blocks_for(config, resolved.arch),
        executor_factory=executor_factory,
        budget_controller=budget_controller,
        clock=clock,
    )
