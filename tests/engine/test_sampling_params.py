"""SamplingParams validation names the bad field."""

from __future__ import annotations

import pytest

from sarathi import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"seed": "x"}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_defaults_and_normalisation():
    p = SamplingParams(stop="###", stop_token_ids=[5])
    assert p.stop == ("###",) and p.stop_token_ids == (5,)
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy
    hash(p)
