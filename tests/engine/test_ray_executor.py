"""``distributed_executor_backend="ray"``: Ray actors (on a local instance bound to 127.0.0.1) produce the
single-process engine's greedy tokens (exactly, in float32) under pipeline and tensor parallelism, also with
preemptions; a killed actor or a late step fails the engine naming the ranks; placement fails clearly when no
CPU is free."""

from __future__ import annotations

import os
import time

import pytest

ray = pytest.importorskip("ray")

from sarathi import LLM, SamplingParams  # noqa: E402
from sarathi.engine.executor_base import WorkerFailedError  # noqa: E402
from sarathi.executor.ray_executor import RayExecutor, start_local_ray  # noqa: E402

PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
# Multiples of the block size (16) but 5: 52 blocks of prompts, 67 with 24 tokens more each. A cache of 60
# blocks admits them all, then runs out while they decode: preemptions.
LENGTHS = [5, 48, 80, 96, 112, 128, 160, 192]
CONFIGS = {
    "pp2-sarathi-preempt": dict(
        scheduler="sarathi", token_budget=64, num_kv_blocks=60, pipeline_parallel_size=2
    ),
    "pp2-vllm": dict(scheduler="vllm", pipeline_parallel_size=2),
    "tp2-vllm-preempt": dict(scheduler="vllm", num_kv_blocks=60, tensor_parallel_size=2),
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One Ray instance for the module (starting one costs seconds)."""
    start_local_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer) -> list[list[int]]:
    import json

    tokens = smollm2_tokenizer.encode(json.__doc__ * 4)
    return [tokens[7 * i : 7 * i + n] for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def reference(prompts) -> list[list[int]]:
    with LLM(num_kv_blocks=256, dtype="float32") as llm:
        return [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


# `make test-all` only (~14 s on a 2-core Zen5): pipeline stages over Ray are checked in `make test` by
# pp2-sarathi-preempt, and the vllm scheduler's outputs do not depend on the backend.
SLOW_CONFIGS = ("pp2-vllm",)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CONFIGS else n for n in CONFIGS]
)
def test_same_tokens_as_one_process_then_a_timeout(name, prompts, reference):
    config = CONFIGS[name]
    with LLM(distributed_executor_backend="ray", dtype="float32", **config) as llm:
        executor = llm.engine.executor
        assert isinstance(executor, RayExecutor) and len(executor.actors) == 2
        assert executor.max_in_flight == config.get("pipeline_parallel_size", 1)
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
        stats = list(llm.engine.stats)
        timings = llm.engine.take_stage_timings()
        assert llm.engine.block_manager.num_used_blocks == 0
        executor.step_timeout_s = 1e-3  # no step is that fast: the executor gives up, naming every rank
        with pytest.raises(WorkerFailedError, match=r"workers rank 0 .*, rank 1 .* took too long to finish"):
            llm.generate(prompts[-1:], PARAMS, use_tqdm=False)
    assert [o.token_ids for o in outs] == reference
    if name.endswith("preempt"):
        assert sum(s.num_preempted for s in stats) > 0, "the small KV cache should have forced preemptions"
    stages = config.get("pipeline_parallel_size", 1)
    assert len(timings) == stages * len(stats) and all(t.start <= t.end for t in timings)


def test_a_killed_actor_fails_the_next_step_naming_its_rank(prompts):
    with LLM(distributed_executor_backend="ray", tensor_parallel_size=2) as llm:
        engine = llm.engine
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, PARAMS)
        engine.step()
        executor = engine.executor
        executor.check_health()
        ray.kill(executor.actors[1])
        with pytest.raises(WorkerFailedError, match=r"rank 1 \(pipeline stage 0, tensor-parallel rank 1\)"):
            engine.step()
        pids = executor.worker_pids
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == 2 and not any(_alive(p) for p in pids), "shutdown should stop every actor"


def test_the_health_check_notices_a_dead_idle_actor(prompts):
    with LLM(distributed_executor_backend="ray", pipeline_parallel_size=2) as llm:
        executor = llm.engine.executor
        executor.check_health()
        ray.kill(executor.actors[1])
        deadline = time.monotonic() + 10
        with pytest.raises(WorkerFailedError, match=r"rank 1 \(pipeline stage 1, tensor-parallel rank 0\)"):
            while time.monotonic() < deadline:
                executor.check_health()
                time.sleep(0.1)
        llm.engine.add_request("late", prompts[0], PARAMS)
        with pytest.raises(WorkerFailedError, match="rank 1"):
            llm.engine.step()


def test_no_free_cpu_is_a_clear_error():
    hog = ray.util.placement_group([{"CPU": 2}])
    ray.get(hog.ready(), timeout=30)
    try:
        with pytest.raises(RuntimeError, match=r"2 workers x 0 CPU asked, 0 CPUs free of 2"):
            LLM(distributed_executor_backend="ray", pipeline_parallel_size=2)
    finally:
        ray.util.remove_placement_group(hog)
