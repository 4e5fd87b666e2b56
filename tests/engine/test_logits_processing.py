"""logit_bias, penalties and min_p, batched as tensors, against a plain per-token reference."""

from __future__ import annotations

import pytest
import torch

from sarathi.sampling_params import SamplingParams
from sarathi.worker.logits_processing import apply_bias_and_penalties, apply_min_p
from sarathi.worker.sampler import Sampler

VOCAB = 40


def _reference(logits: torch.Tensor, p: SamplingParams, history: list[int], num_output: int) -> torch.Tensor:
    out = logits.clone()
    for token, value in p.logit_bias:
        out[token] += value
    prompt, output = history[: len(history) - num_output], history[len(history) - num_output :]
    for token in set(prompt) | set(output):
        x = float(out[token])
        out[token] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
    for token in set(output):
        out[token] -= p.frequency_penalty * output.count(token) + p.presence_penalty
    return out


CASES = [
    (SamplingParams(repetition_penalty=1.3), [1, 2, 2, 5, 7, 7, 7], 3),
    (SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4), [3, 4, 9, 9, 9, 4, 11], 4),
    (SamplingParams(logit_bias={3: 5.0, "10": -100}), [1, 2], 0),
    (SamplingParams(), [5, 6], 1),
    (
        SamplingParams(repetition_penalty=0.8, frequency_penalty=2, presence_penalty=1.5, logit_bias={0: 1}),
        [0, 0, 1, 2, 3, 0, 1],
        5,
    ),
]


def test_bias_and_penalties_match_the_reference():
    torch.manual_seed(0)
    logits = torch.randn(len(CASES), VOCAB) * 3
    params = [p for p, _, _ in CASES]
    histories = [h for _, h, _ in CASES]
    steps = [n for _, _, n in CASES]
    got = apply_bias_and_penalties(logits, params, steps, histories)
    for i, (p, history, n) in enumerate(CASES):
        torch.testing.assert_close(got[i], _reference(logits[i], p, history, n), rtol=1e-6, atol=1e-6)
    neutral = [SamplingParams()] * 2
    assert torch.equal(apply_bias_and_penalties(logits[:2], neutral, [0, 0], None), logits[:2])


def test_min_p_keeps_tokens_within_min_p_of_the_top_after_temperature():
    torch.manual_seed(1)
    logits = torch.randn(3, VOCAB) * 2
    params = [
        SamplingParams(temperature=0.7, min_p=0.2),
        SamplingParams(temperature=0.0, min_p=0.9),  # greedy: untouched
        SamplingParams(temperature=1.5, min_p=0.05),
    ]
    got = apply_min_p(logits, params)
    for i, p in enumerate(params):
        if p.greedy:
            assert torch.equal(got[i], logits[i])
            continue
        probs = (logits[i] / p.temperature).softmax(-1)
        keep = probs >= p.min_p * probs.max()
        assert torch.equal(torch.isfinite(got[i]), keep)
        assert torch.equal(got[i][keep], logits[i][keep])


def test_sampler_applies_them_and_rows_do_not_interfere():
    torch.manual_seed(2)
    logits = torch.randn(3, VOCAB)
    forced = SamplingParams(temperature=0.0, logit_bias={17: 100})
    penalized = SamplingParams(temperature=0.0, frequency_penalty=2.0, presence_penalty=2.0)
    top = int(logits[1].argmax())
    histories = [[1], [top, top, top], [2]]
    alone = Sampler()(logits[1:2], [penalized], [3], histories[1:2])
    tokens = Sampler()(logits, [forced, penalized, SamplingParams(temperature=0.0)], [0, 3, 0], histories)
    assert tokens[0] == 17 and tokens[1] == alone[0] != top and tokens[2] == int(logits[2].argmax())
    # min_p with a seed: every draw is among the kept tokens
    p = SamplingParams(temperature=1.0, min_p=0.5, seed=3)
    probs = logits[0].softmax(-1)
    kept = set(torch.nonzero(probs >= 0.5 * probs.max()).flatten().tolist())
    assert {Sampler()(logits[:1], [p], [s])[0] for s in range(30)} <= kept


@pytest.mark.parametrize(
    "kwargs",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"repetition_penalty": 0},
        {"min_p": 1.5},
        {"logit_bias": {"x": 1}},
        {"logit_bias": {1: 101}},
        {"logit_bias": {-1: 1}},
    ],
)
def test_bad_values_are_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)
