"""How engines are built: the engine is handed its model facts, KV pool, executor and budget controller
(sarathi/executor/assemble.py, sarathi/entrypoints/build.py); what StepResult and snapshot() report."""

from __future__ import annotations

import pytest

from sarathi.config import engine_config
from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.core.schedulers.adaptive_budget import AdaptiveBudget
from sarathi.engine.model_info import ModelInfo
from sarathi.entrypoints import build
from sarathi.executor.assemble import assemble_engine
from sarathi.simulator.clock import SimulatedClock
from sarathi.simulator.executor import SimulatedExecutor
from tests.simulator.test_simulator import TINY


class PerToken(LatencyModel):
    def iteration_time(self, shape: BatchShape) -> float:
        return 0.001 * (1 + shape.num_tokens)


def tiny(**kw):
    return engine_config(load_format="dummy", hf_config=TINY, num_kv_blocks=64, token_budget=8, **kw)


def simulated(calls: list):
    clock = SimulatedClock()

    def factory(config, num_kv_blocks, eos_token_ids):
        calls.append((num_kv_blocks, eos_token_ids))
        return SimulatedExecutor(PerToken(), clock, token_id=5)

    return factory, clock


def test_the_engine_gets_the_checkpoints_facts_and_starts_its_executor_last():
    calls: list = []
    factory, clock = simulated(calls)
    engine = assemble_engine(tiny(), executor_factory=factory, clock=clock.now)
    assert engine.model == ModelInfo(vocab_size=1000, max_position_embeddings=512, eos_token_ids=(2,))
    assert calls == [(64, (2,))] and engine.num_kv_blocks == 64
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds"):
        assemble_engine(tiny(max_model_len=4096), executor_factory=factory, clock=clock.now)
    assert len(calls) == 1  # a configuration refused before any worker would start


def test_an_adaptive_budget_needs_a_controller_from_the_builder():
    factory, clock = simulated([])
    with pytest.raises(ValueError, match="budget controller"):
        assemble_engine(tiny(adaptive_tbt_slo=0.05), executor_factory=factory, clock=clock.now)
    controller = AdaptiveBudget(0.05, PerToken())
    engine = assemble_engine(
        tiny(adaptive_tbt_slo=0.05), budget_controller=controller, executor_factory=factory, clock=clock.now
    )
    assert engine.scheduler.budget_controller is controller


def test_build_engine_gives_an_adaptive_budget_this_machines_latency_model(monkeypatch):
    model = PerToken()
    monkeypatch.setattr(build, "machine_latency_model", lambda config: model)
    built = {}
    monkeypatch.setattr(build, "assemble_engine", lambda config, **kw: built.update(kw) or "engine")
    assert build.build_engine(tiny(adaptive_tbt_slo=0.05)) == "engine"
    controller = built["budget_controller"]
    assert isinstance(controller, AdaptiveBudget) and controller.latency_model is model
    assert controller.tbt_slo == 0.05
    build.build_engine(tiny())
    assert built["budget_controller"] is None


def test_step_returns_its_outputs_and_iteration_and_snapshot_counts_queues_and_blocks():
    factory, clock = simulated([])
    engine = assemble_engine(tiny(max_num_seqs=1), executor_factory=factory, clock=clock.now)
    engine.add_request("a", list(range(10, 30)))
    engine.add_request("b", list(range(40, 50)))
    snap = engine.snapshot()
    assert (snap.num_waiting, snap.num_running, snap.num_kv_blocks_used, snap.num_kv_blocks_total) == (
        2,
        0,
        0,
        64,
    )
    result = engine.step()
    assert result.iteration is engine.stats[-1] and result.iteration.num_prefill_tokens == 8
    assert result.outputs == []  # a first chunk of "a": nobody got a token yet
    snap = engine.snapshot()
    assert (snap.num_waiting, snap.num_running) == (1, 1) and snap.num_kv_blocks_used > 0
    while engine.has_unfinished_requests():
        result = engine.step()
    assert [o.request_id for o in result.outputs if o.finished] == ["b"]
    assert engine.snapshot().num_kv_blocks_used == 0
