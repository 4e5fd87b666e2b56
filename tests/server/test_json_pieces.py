"""Big JSON bodies encoded in pieces are byte for byte what starlette's JSONResponse sends."""

from __future__ import annotations

import pytest
from fastapi.responses import JSONResponse
from hypothesis import given
from hypothesis import strategies as st

from sarathi.entrypoints.openai.engine_requests import sse
from sarathi.entrypoints.openai.json_pieces import render_json, sse_in_pieces

_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
_keys = st.text() | st.integers() | st.booleans() | st.none()
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=80) | st.dictionaries(_keys, inner, max_size=6),
    max_leaves=400,
)


@given(_json)
def test_same_bytes_as_json_response(obj):
    assert render_json(obj) == JSONResponse(obj).body


def test_prompt_logprobs_shaped_body():
    body = {
        "choices": [
            {
                "text": 'é"x',
                "prompt_logprobs": [None]
                + [{t: {"logprob": -0.5 * t, "rank": t, "decoded_token": f"t{t}"} for t in range(21)}] * 500,
            }
        ],
        "usage": {"prompt_tokens": 501},
    }
    assert render_json(body) == JSONResponse(body).body


def test_non_finite_numbers_are_refused_as_by_json_response():
    with pytest.raises(ValueError):
        render_json({"x": [float("inf")] * 100})


@given(st.dictionaries(st.text(), _json | st.floats(), max_size=4))
def test_server_sent_event_same_as_sse(payload):
    assert sse_in_pieces(payload) == sse(payload)
