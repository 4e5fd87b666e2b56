"""Workload generators: lengths from traces and synthetic distributions, scaling, arrivals, seeds."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from sarathi.benchmark.workload import (
    BUILTIN_TRACES,
    SyntheticLengths,
    TokenSpace,
    WorkloadConfig,
    arrival_times,
    generate_workload,
    load_trace,
    scale_lengths,
)


def test_poisson_rate_within_tolerance():
    times = arrival_times(20_000, "poisson", 4.0, 1.0, np.random.default_rng(0))
    rate = len(times) / times[-1]
    assert rate == pytest.approx(4.0, rel=0.03)
    gaps = np.diff(times)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


def test_gamma_rate_and_cv():
    times = arrival_times(20_000, "gamma", 2.0, 3.0, np.random.default_rng(1))
    gaps = np.diff(times)
    assert 1 / np.mean(gaps) == pytest.approx(2.0, rel=0.08)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(3.0, rel=0.1)


def test_no_qps_means_everything_at_once():
    assert arrival_times(5, "poisson", None, 1.0, np.random.default_rng(0)) == [0.0] * 5


@pytest.mark.parametrize("name", list(BUILTIN_TRACES))
def test_builtin_traces_load(name):
    rows = load_trace(name)
    assert len(rows) > 1000 and all(r.num_prefill_tokens > 0 and r.num_decode_tokens > 0 for r in rows[:100])
    assert (rows[0].arrived_at is not None) == name.startswith("splitwise")


def test_trace_lengths_are_honored():
    rows = {(r.num_prefill_tokens, r.num_decode_tokens) for r in load_trace("sharegpt")}
    reqs = generate_workload(WorkloadConfig(trace="sharegpt", num_requests=50, max_total_tokens=None))
    assert all((r.num_prompt_tokens, r.num_output_tokens) in rows for r in reqs)


def test_trace_timestamps_in_order_and_rescaled():
    rows = load_trace("splitwise_conv")[:20]
    raw = generate_workload(
        WorkloadConfig(trace="splitwise_conv", num_requests=20, arrival="trace", qps=None)
    )
    assert [r.arrival_time for r in raw] == pytest.approx([r.arrived_at - rows[0].arrived_at for r in rows])
    assert [r.num_prompt_tokens for r in raw] == [r.num_prefill_tokens for r in rows]
    fast = generate_workload(
        WorkloadConfig(trace="splitwise_conv", num_requests=20, arrival="trace", qps=5.0)
    )
    assert fast[-1].arrival_time == pytest.approx(19 / 5.0)  # mean rate 5 QPS, same relative spacing
    ratio = np.array([r.arrival_time for r in fast[1:]]) / np.array([r.arrival_time for r in raw[1:]])
    assert np.allclose(ratio, ratio[0])


def test_scaling_and_capping():
    assert scale_lengths(1000, 200, 0.1, None) == (100, 20)
    assert scale_lengths(3, 1, 0.1, None) == (1, 1)  # never below one token
    p, d = scale_lengths(3000, 1000, 1.0, 400)
    assert p + d <= 400 and p == 300 and d == 100  # shrunk in proportion
    reqs = generate_workload(
        WorkloadConfig(trace="arxiv", num_requests=200, length_scale=0.25, max_total_tokens=512)
    )
    assert all(r.num_prompt_tokens + r.num_output_tokens <= 512 for r in reqs)
    assert max(r.num_prompt_tokens for r in reqs) > 256  # arxiv prompts are long


def test_synthetic_distributions():
    fixed = generate_workload(
        WorkloadConfig(trace="synthetic", num_requests=10, synthetic=SyntheticLengths("fixed", 1, 100, 1, 7))
    )
    assert {(r.num_prompt_tokens, r.num_output_tokens) for r in fixed} == {(100, 7)}
    spec = SyntheticLengths("uniform", 10, 20, 5, 6)
    uni = generate_workload(WorkloadConfig(trace="synthetic", num_requests=500, synthetic=spec))
    assert {r.num_prompt_tokens for r in uni} == set(range(10, 21)) and {
        r.num_output_tokens for r in uni
    } == {5, 6}
    zipf = generate_workload(
        WorkloadConfig(
            trace="synthetic", num_requests=2000, synthetic=SyntheticLengths("zipf", 1, 1000, 1, 10)
        )
    )
    lens = [r.num_prompt_tokens for r in zipf]
    assert min(lens) >= 1 and max(lens) <= 1000 and statistics.median(lens) < 100  # heavy head


def test_seeds_reproducible_and_prompt_ids_valid():
    space = TokenSpace(vocab_size=1000, excluded=frozenset({0, 1, 2, 999}))
    cfg = WorkloadConfig(trace="sharegpt", num_requests=20, qps=2.0, length_scale=0.05, seed=7)
    a, b = generate_workload(cfg, space), generate_workload(cfg, space)
    assert a == b
    c = generate_workload(
        WorkloadConfig(trace="sharegpt", num_requests=20, qps=2.0, length_scale=0.05, seed=8), space
    )
    assert [r.arrival_time for r in a] != [r.arrival_time for r in c]
    for r in a:
        assert len(r.prompt_token_ids) == r.num_prompt_tokens
        assert all(0 <= t < 1000 and t not in space.excluded for t in r.prompt_token_ids)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="unknown arrival process 'uniform'"):
        WorkloadConfig(arrival="uniform")
    with pytest.raises(ValueError, match="qps must be a positive number"):
        WorkloadConfig(qps=0.0)
    with pytest.raises(ValueError, match="neither a file nor a built-in trace"):
        generate_workload(WorkloadConfig(trace="nope.csv"))
    with pytest.raises(ValueError, match="unknown length distribution"):
        SyntheticLengths("normal")
