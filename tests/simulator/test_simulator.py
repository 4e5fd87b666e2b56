"""The simulator: the production scheduler in simulated time, timelines, pipelines, replicas, fitting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sarathi.benchmark.capacity import Probe, Slo
from sarathi.benchmark.workload import BenchRequest
from sarathi.config import engine_config
from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.core.schedulers import SCHEDULERS
from sarathi.core.schedulers.adaptive_budget import AdaptiveBudget
from sarathi.simulator.cluster import Router, make_replica, simulate
from sarathi.simulator.measured import MeasuredLatencyModel, Sample, features, fit
from sarathi.simulator.tune import Candidate, tune

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "eos_token_id": 2,
}


class Linear(LatencyModel):
    """``base + per_token * tokens`` seconds per iteration, split evenly over ``num_stages``."""

    def __init__(self, base: float, per_token: float, num_stages: int = 1) -> None:
        self.base, self.per_token, self.num_stages = base, per_token, num_stages

    def iteration_time(self, shape: BatchShape) -> float:
        return self.base + self.per_token * shape.num_tokens


def config(scheduler="sarathi", budget=4, pp=1, **kw):
    return engine_config(
        load_format="dummy",
        hf_config=TINY,
        num_kv_blocks=64,
        scheduler=scheduler,
        token_budget=budget,
        pipeline_parallel_size=pp,
        **kw,
    )


def request(rid, arrival, prompt_len, output_len) -> BenchRequest:
    return BenchRequest(rid, arrival, prompt_len, output_len, tuple(range(10, 10 + prompt_len)))


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_the_simulator_runs_the_production_scheduler_classes(name):
    replica = make_replica(config(name, budget=64), Linear(1.0, 0.0))
    assert type(replica.engine.scheduler) is SCHEDULERS[name]
    store = simulate([replica], [request("a", 0.0, 20, 3), request("b", 0.5, 30, 2)])
    assert store.summary()["num_output_tokens"] == 5


def test_timeline_matches_the_hand_computed_one():
    # Iterations cost 1 s + 0.1 s per token. A: 10-token prompt at t=0, chunks 4+4+2 (1.4, 1.4, 1.2 s):
    # first token at 4.0, then decodes of 1.1 s at 5.1 and (with B's 3-token chunk: 1.4 s) at 6.5.
    # B arrives at 4.5 mid-iteration, is first scheduled at 5.1, and its last 2 prompt tokens end at 7.7.
    replica = make_replica(config(budget=4), Linear(1.0, 0.1))
    store = simulate([replica], [request("a", 0.0, 10, 3), request("b", 4.5, 5, 2)])
    a, b = store.requests["a"], store.requests["b"]
    assert a.token_times == pytest.approx([4.0, 5.1, 6.5])
    assert b.first_scheduled_time == pytest.approx(5.1)
    assert b.token_times == pytest.approx([7.7, 8.8])
    assert [s.wall_time for s in replica.engine.stats] == pytest.approx([1.4, 1.4, 1.2, 1.1, 1.4, 1.2, 1.1])


def test_pipeline_stages_overlap_micro_batches():
    # Two stages of 1 s each; two 2-token prompts fill a budget of 2 each, so they go in different
    # micro-batches: the second starts stage 0 while the first is in stage 1, and finishes 1 s later.
    replica = make_replica(config(budget=2, pp=2), Linear(2.0, 0.0, num_stages=2))
    store = simulate([replica], [request("a", 0.0, 2, 1), request("b", 0.0, 2, 1)])
    assert store.requests["a"].token_times == pytest.approx([2.0])
    assert store.requests["b"].token_times == pytest.approx([3.0])
    timings = sorted((t.step_id, t.stage, t.start, t.end) for t in store.stage_timings)
    assert timings == [(0, 0, 0.0, 1.0), (0, 1, 1.0, 2.0), (1, 0, 1.0, 2.0), (1, 1, 2.0, 3.0)]


def test_routers_spread_requests():
    reqs = [request(f"r{i}", 0.1 * i, 8, 4) for i in range(6)]
    for policy in ("round_robin", "least_outstanding"):
        replicas = [make_replica(config(budget=64), Linear(1.0, 0.0)) for _ in range(3)]
        simulate(replicas, reqs, Router(policy))
        assert [r.feeder.num_finished for r in replicas] == [2, 2, 2]
    with pytest.raises(ValueError, match="unknown router"):
        Router("random")


def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    knots = [16.0, 64.0]
    truth = [0.02, 1e-4, 3e-4, 1e-4, 2e-8, 5e-7, 1e-5]
    samples = []
    for _ in range(80):
        p, d, c = int(rng.integers(0, 300)), int(rng.integers(0, 40)), int(rng.integers(1, 1000))
        if p + d == 0:
            continue
        shape = BatchShape.from_grid(p, d, c)
        samples.append(Sample(shape, float(np.dot(truth, features(shape, knots)))))
    model = fit(samples, knots=knots, ridge=0.0)
    assert model.coefficients == pytest.approx(truth, rel=1e-6, abs=1e-12)
    again = MeasuredLatencyModel.from_json(model.to_json())
    assert again.iteration_time(samples[0].shape) == pytest.approx(samples[0].seconds)


def test_tune_picks_the_known_optimum():
    # A made-up system whose capacity peaks at budget 256: QPS beyond the peak break the TBT SLO.
    peak = {32: 1.0, 64: 2.0, 128: 3.0, 256: 4.0, 512: 3.5, 1024: 2.5}

    def measure(c: Candidate, qps: float) -> Probe:
        return Probe(qps, 0.05 if qps <= peak[c.token_budget] else 1.0, 0.1)

    result = tune([Candidate(b, 128) for b in peak], measure, Slo("x", 0.1))
    assert result.best == Candidate(256, 128)
    assert result.best_capacity == pytest.approx(4.0, rel=0.1)


def test_adaptive_budget_shrinks_with_slack():
    replica = make_replica(config(budget=256, adaptive_tbt_slo=2.0), Linear(1.0, 0.01))
    controller = replica.engine.scheduler.budget_controller
    assert isinstance(controller, AdaptiveBudget)
    store = simulate([replica], [request("a", 0.0, 200, 5), request("b", 3.0, 400, 2)])
    # Alone, A's whole prompt fits in one iteration (3 s); once A decodes, B's chunks are sized so that
    # an iteration stays within 0.9 x the 2 s target.
    assert controller.history[0] == 256
    assert min(controller.history) < 256
    gaps = np.diff(store.requests["a"].token_times)
    assert max(gaps) <= 2.0 + 1e-9
    assert not math.isnan(store.summary()["tbt_p99"])


def test_simulate_and_tune_commands_write_what_bench_writes(tmp_path):
    import json

    from sarathi.benchmark.bench import SUMMARY_KEYS
    from sarathi.entrypoints.cli import main

    common = ["--hardware", "a100", "--model-spec", "mistral-7b", "--trace", "sharegpt", "--no-progress"]
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                *common,
                "--num-requests",
                "30",
                "--qps",
                "2",
                "--schedulers",
                "sarathi,vllm",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    entries = json.loads((out / "summary.json").read_text())
    assert [e["label"] for e in entries] == ["sarathi", "vllm"]
    assert all(set(SUMMARY_KEYS) <= set(e) and e["mode"] == "simulated" for e in entries)
    assert (out / "sarathi" / "requests.csv").is_file() and (out / "tbt_cdf.png").is_file()

    tuned = tmp_path / "tune"
    assert (
        main(
            [
                "tune",
                *common,
                "--tbt-slo",
                "0.1",
                "--budgets",
                "256,2048",
                "--num-requests",
                "40",
                "--output-dir",
                str(tuned),
            ]
        )
        == 0
    )
    record = json.loads((tuned / "tune.json").read_text())
    assert record["best"]["token_budget"] in (256, 2048) and record["best_capacity_qps"] > 0
    assert main(["simulate", "--hardware", "a100", "--no-progress"]) == 2  # --model-spec missing


def test_token_budget_auto_uses_the_cached_machine_profile(tmp_path, monkeypatch):
    import argparse

    from sarathi.benchmark.workload import WorkloadConfig
    from sarathi.entrypoints.args import add_engine_args, engine_config_from_args
    from sarathi.simulator import auto_budget, machine_profile

    # A made-up machine: 20 ms per iteration plus 0.5 ms per token, so a P99 TBT of 0.1 s allows
    # iterations of up to ~160 tokens and tune must not pick the largest budgets.
    model = MeasuredLatencyModel(knots=[], coefficients=[0.02, 5e-4, 0.0, 0.0, 0.0])
    monkeypatch.setenv("SARATHI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(machine_profile.PROFILE_ENV, raising=False)
    small = WorkloadConfig(trace="synthetic", num_requests=24, length_scale=1.0)
    monkeypatch.setattr(auto_budget, "AUTO_WORKLOAD", small)
    parser = add_engine_args(argparse.ArgumentParser())
    args = parser.parse_args(["--token-budget", "auto", "--tbt-slo", "0.1"])
    model.save(machine_profile.cached_profile_path(engine_config_from_args(parser.parse_args([]))))
    monkeypatch.setattr(machine_profile, "profile_machine", lambda *a, **k: pytest.fail("profiled again"))
    budget = engine_config_from_args(args).scheduler.token_budget
    assert 32 <= budget <= 128
    # Without --tbt-slo the SLO is 5x the one-sequence decode iteration (~103 ms here).
    default = engine_config_from_args(parser.parse_args(["--token-budget", "auto"])).scheduler.token_budget
    assert 32 <= default <= 128
