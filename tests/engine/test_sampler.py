"""Sampler: greedy, temperature, top-k, top-p and per-request seeds."""

from __future__ import annotations

import pytest
import torch

from sarathi.sampling_params import SamplingParams
from sarathi.worker.sampler import Sampler


@pytest.fixture
def logits() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(4, 1000) * 3


def test_greedy_is_argmax(logits):
    params = [SamplingParams(temperature=0.0)] * 4
    assert Sampler()(logits, params, [0] * 4) == logits.argmax(-1).tolist()


def test_top_k_one_and_tiny_top_p_are_greedy(logits):
    for p in (SamplingParams(top_k=1), SamplingParams(top_p=1e-6, seed=3)):
        assert Sampler()(logits, [p] * 4, [0] * 4) == logits.argmax(-1).tolist()


def test_top_k_only_picks_from_the_k_best(logits):
    sampler = Sampler(seed=1)
    top5 = set(torch.topk(logits[0], 5).indices.tolist())
    picks = {sampler(logits[:1], [SamplingParams(top_k=5, temperature=2.0)], [0])[0] for _ in range(200)}
    assert picks <= top5 and len(picks) > 1


def test_top_p_keeps_the_smallest_covering_set():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler(seed=2)
    picks = {sampler(logits, [SamplingParams(top_p=0.7)], [0])[0] for _ in range(300)}
    assert picks == {0, 1}


def test_temperature_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    sampler = Sampler(seed=4)
    n = 3000
    counts = torch.zeros(3)
    for _ in range(n):
        counts[sampler(probs.log()[None], [SamplingParams(temperature=1.0)], [0])[0]] += 1
    assert torch.allclose(counts / n, probs, atol=0.04)


def test_seed_makes_a_row_independent_of_its_neighbours(logits):
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone = Sampler(seed=0)(logits[:1], [seeded], [7])
    other = SamplingParams(temperature=1.0)
    batched = Sampler(seed=99)(logits[[1, 0, 2]], [other, seeded, other], [0, 7, 3])
    assert batched[1] == alone[0]
    # Another step of the same request draws fresh noise.
    steps = {Sampler()(logits[:1], [seeded], [s])[0] for s in range(50)}
    assert len(steps) > 1


def test_row_count_must_match(logits):
    with pytest.raises(ValueError, match="logit rows"):
        Sampler()(logits, [SamplingParams()], [0])
