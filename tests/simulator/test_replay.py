"""Replay: with the measured iteration times of a real run as its latency model, the simulator makes the
same batches as the real engine, iteration by iteration."""

from __future__ import annotations

import random

from sarathi.benchmark.runner import run_in_process, warm_up
from sarathi.benchmark.workload import BenchRequest
from sarathi.config import engine_config
from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.entrypoints.build import build_engine
from sarathi.simulator.cluster import make_replica, simulate, simulation_config


class UntilNextStart(LatencyModel):
    """Each iteration ends when the real run's next iteration started (or, before an idle gap, when the
    real iteration ended): the simulated clock then stands where the real one stood at every decision."""

    def __init__(self, ends: list[float]) -> None:
        self.ends = ends
        self.clock = None
        self.calls = 0

    def iteration_time(self, shape: BatchShape) -> float:
        end = self.ends[self.calls]
        self.calls += 1
        return max(0.0, end - self.clock.now())


def test_simulator_replays_the_real_engines_batches():
    rng = random.Random(3)
    arrival, requests = 0.0, []
    for i in range(10):
        arrival += rng.expovariate(6.0)
        n = rng.randint(20, 110)
        prompt = tuple(rng.randrange(100, 40000) for _ in range(n))
        requests.append(BenchRequest(f"r{i}", arrival, n, rng.randint(3, 10), prompt))

    config = engine_config(scheduler="sarathi", token_budget=32, num_kv_blocks=256)
    engine = build_engine(config)
    try:
        warm_up(engine, requests[0].prompt_token_ids[:16])
        first = len(engine.stats)
        added: dict[str, float] = {}
        real_add = engine.add_request

        def add_request(request_id, prompt, params, arrival_time):
            added[request_id] = engine.clock()
            real_add(request_id, prompt, params, arrival_time)

        engine.add_request = add_request
        run_in_process(engine, requests)
        real = list(engine.stats)[first:]
    finally:
        engine.shutdown()

    ends = []
    for i, s in enumerate(real):
        busy = s.num_running + s.num_waiting > 0 and i + 1 < len(real)
        ends.append(real[i + 1].start_time if busy else s.start_time + s.wall_time)
    model = UntilNextStart(ends)
    replica = make_replica(simulation_config(config), model)
    model.clock = replica.clock
    # Each request arrives when the real driver handed it to the engine.
    replayed = [
        BenchRequest(
            r.request_id, added[r.request_id], r.num_prompt_tokens, r.num_output_tokens, r.prompt_token_ids
        )
        for r in requests
    ]
    simulate([replica], replayed)
    simulated = list(replica.engine.stats)

    assert len(real) > 20
    assert [s.seq_ids for s in simulated] == [s.seq_ids for s in real]
    assert [(s.num_prefill_tokens, s.num_decode_tokens) for s in simulated] == [
        (s.num_prefill_tokens, s.num_decode_tokens) for s in real
    ]
