"""Whole-scheduler property tests: random workloads on small KV caches, run to completion.

``run_workload`` checks every invariant at every step (see sim.py): block ownership, KV reserved before
tokens are scheduled, each policy's batching rules, recompute coverage after preemption, liveness, and
that every request that was not aborted ends with exactly its expected number of outputs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi.config import SCHEDULER_NAMES, ChunkSchedule, SchedulerConfig
from sarathi.core.block_manager import BlockManager
from sarathi.core.schedulers import max_step_tokens

from .sim import Abort, Request, build, run_workload

PROPERTY_SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def chunk_schedules(draw: st.DrawFn) -> ChunkSchedule | None:
    if draw(st.booleans()):
        return None
    low = draw(st.integers(1, 16))
    return ChunkSchedule(
        low_chunk_size=low,
        high_chunk_size=draw(st.integers(low, 48)),
        num_stages=draw(st.integers(1, 4)),
        tokens_per_stage=draw(st.integers(1, 24)),
    )


@st.composite
def setups(draw: st.DrawFn, name: str) -> dict:
    """Scheduler settings with a KV cache barely big enough for the longest request (so it preempts)."""
    max_model_len = draw(st.integers(4, 64))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    watermark = draw(st.sampled_from([0.0, 0.0, 0.05, 0.2]))
    # KV-cache groups: global attention only, or sliding windows beside it (Gemma 3), or sliding only.
    window = draw(st.integers(1, 24))
    kinds = [(None,), (None,), (window, None), (window, window, None), (window,)]
    group_windows = draw(st.sampled_from(kinds))
    config = SchedulerConfig(
        name=name,
        token_budget=draw(st.integers(1, 8) | st.integers(1, 80)),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.none() | st.integers(8, 2 * max_model_len)),
        chunk_schedule=draw(chunk_schedules()),
    )
    num_blocks = -(-max_model_len // block_size) + draw(st.integers(0, 6))
    step = max_step_tokens(config)
    while not BlockManager(
        num_blocks, block_size, watermark, group_windows=group_windows, max_step_tokens=step
    ).fits_in_empty_cache(max_model_len):
        num_blocks += 1
    return dict(
        name=name,
        group_windows=group_windows,
        num_blocks=num_blocks,
        block_size=block_size,
        watermark=watermark,
        max_model_len=max_model_len,
        token_budget=config.token_budget,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        chunk_schedule=config.chunk_schedule,
        enable_caching=draw(st.booleans()),  # the fake prompts share prefixes: caching hits often
    )


@st.composite
def workloads(draw: st.DrawFn, max_model_len: int) -> tuple[list[Request], list[Abort]]:
    requests = draw(
        st.lists(
            st.builds(
                Request,
                prompt_len=st.integers(1, max_model_len),
                max_tokens=st.integers(1, 24),
                arrival_step=st.integers(0, 2) | st.integers(0, 30),  # bursts and trickles
            ),
            min_size=1,
            max_size=12,
        )
    )
    aborts = draw(
        st.lists(
            st.builds(
                Abort,
                step=st.integers(0, 60),
                request=st.integers(0, len(requests) - 1),
                mid_step=st.booleans(),
            ),
            max_size=3,
        )
    )
    return requests, aborts


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_workloads_run_to_completion(name: str, data: st.DataObject) -> None:
    setup = data.draw(setups(name))
    requests, aborts = data.draw(workloads(setup["max_model_len"]))
    run_workload(build(**setup), requests, aborts)


@pytest.mark.parametrize("name", ["sarathi", "vllm", "simple_chunking"])
def test_tight_caches_do_preempt(name: str) -> None:
    """Guard against the property test silently never exercising preemption."""
    sched = build(name, num_blocks=8, block_size=2, max_model_len=16, token_budget=32)
    requests = [Request(prompt_len=4, max_tokens=12, arrival_step=0) for _ in range(6)]
    result = run_workload(sched, requests, [])
    assert result.num_preemptions > 0
    assert any(s.num_preemptions > 0 for s in result.seqs.values())


@pytest.mark.parametrize("name", ["sarathi", "simple_chunking"])
def test_many_short_requests_on_a_tiny_budget(name: str) -> None:
    """More requests than budget tokens: the running cap must keep every decode iteration in budget."""
    sched = build(name, token_budget=2, max_num_seqs=8)
    result = run_workload(sched, [Request(prompt_len=1, max_tokens=10, arrival_step=0) for _ in range(6)], [])
    assert max(b.num_tokens for b in result.batches) == 2
