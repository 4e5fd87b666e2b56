"""benchmarks/bf16_error_budget.py: the int8 path's activations as its simulation takes them."""

import torch

from benchmarks.bf16_error_budget import int8_terms


def _blocks_with_an_outlier() -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(3, 96)
    x[:, 5] = 40.0  # one outlier channel: it flattens the rest of its 32-block
    return x


def test_one_and_two_terms_are_within_their_steps():
    x = _blocks_with_an_outlier()
    step = x.reshape(3, 3, 32).abs().amax(-1, keepdim=True) / 127
    counts = [0, 0]
    one = int8_terms(x, float("inf"), counts).reshape(3, 3, 32)
    two = int8_terms(x, None, counts).reshape(3, 3, 32)
    blocks = x.reshape(3, 3, 32)
    assert ((one - blocks).abs() <= step / 2 * (1 + 1e-5)).all()
    # the remainder is rounded to 1/256 of a step and held to +-127/256: within a step / 256
    assert ((two - blocks).abs() <= step / 256 * (1 + 1e-3)).all()
    assert (two - blocks).abs().max() < (one - blocks).abs().max() / 50
    assert (one / step - torch.round(one / step)).abs().max() < 1e-4  # whole multiples of the step
    assert counts == [18, 9]  # 9 blocks each time; two terms in all of the second call's


def test_two_terms_only_where_the_block_has_an_outlier():
    x = _blocks_with_an_outlier()
    counts = [0, 0]
    mixed = int8_terms(x, 4.0, counts)
    # the outlier's blocks (the first of each row) keep two terms, the flat ones one
    assert counts == [9, 3]
    assert torch.equal(mixed[:, :32], int8_terms(x, None, [0, 0])[:, :32])
    assert torch.equal(mixed[:, 32:], int8_terms(x, float("inf"), [0, 0])[:, 32:])


def test_smaller_blocks_take_their_own_scales():
    x = _blocks_with_an_outlier()
    counts = [0, 0]
    per8 = int8_terms(x, float("inf"), counts, block=8)
    assert counts == [36, 0]
    per32 = int8_terms(x, float("inf"), [0, 0])
    # blocks of 8 away from the outlier are not flattened by it
    assert (per8 - x)[:, 8:32].abs().max() < (per32 - x)[:, 8:32].abs().max()
