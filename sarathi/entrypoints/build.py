"""The entry points' engine builder: the budget policy is resolved here, then the engine is assembled.

``LLM``, ``sarathi generate``, the server's engine core, ``bench`` and ``profile`` build their engines here.
An adaptive budget gets this machine's latency profile (measured once, then cached) as its model.
"""

from __future__ import annotations

from sarathi.config import EngineConfig
from sarathi.core.schedulers.adaptive_budget import AdaptiveBudget
from sarathi.engine.llm_engine import LLMEngine
from sarathi.executor.assemble import assemble_engine
from sarathi.simulator.machine_profile import machine_latency_model


def build_engine(config: EngineConfig) -> LLMEngine:
    """An engine for ``config`` with its workers started."""
    slo = config.scheduler.adaptive_tbt_slo
    controller = None if slo is None else AdaptiveBudget(slo, machine_latency_model(config))
    return assemble_engine(config, budget_controller=controller)
