"""Sequence and Batch: token bookkeeping, stop conditions, preemption, batch entries."""

from __future__ import annotations

import pytest

from sarathi.core.batch import Batch, BatchEntry
from sarathi.core.sequence import Sequence, SequenceStatus
from sarathi.sampling_params import SamplingParams


def _seq(prompt_len: int = 5, **params) -> Sequence:
    return Sequence(
        seq_id="s",
        prompt_token_ids=list(range(10, 10 + prompt_len)),
        sampling_params=SamplingParams(**params),
        arrival_time=0.0,
        max_model_len=12,
        eos_token_ids=(2, 5),
    )


def test_token_slice_spans_prompt_and_output():
    seq = _seq(max_tokens=5)
    seq.append_token(40, 1.0)
    seq.append_token(41, 2.0)
    assert seq.token_slice(3, 4) == [13, 14, 40, 41]
    assert seq.token_slice(5, 2) == [40, 41] and seq.token_slice(0, 2) == [10, 11]


@pytest.mark.parametrize(
    ("token", "params", "status", "reason"),
    [
        (5, {}, SequenceStatus.FINISHED_STOPPED, None),  # the second EOS id counts too
        (2, {}, SequenceStatus.FINISHED_STOPPED, None),
        (5, {"ignore_eos": True}, SequenceStatus.WAITING, None),
        (9, {"stop_token_ids": [9]}, SequenceStatus.FINISHED_STOPPED, 9),
        (9, {"max_tokens": 1}, SequenceStatus.FINISHED_LENGTH, None),
    ],
)
def test_stop_conditions(token, params, status, reason):
    seq = _seq(**params)
    seq.append_token(token, 3.0)
    assert seq.status is status and seq.stop_reason == reason
    assert seq.finished_time == (3.0 if status.is_finished else None)


def test_max_model_len_ends_generation():
    seq = _seq(prompt_len=10, max_tokens=50)
    seq.append_token(40, 1.0)
    assert not seq.is_finished
    seq.append_token(41, 2.0)
    assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.num_tokens == 12 == seq.max_num_tokens


def test_preempt_keeps_outputs_and_recomputes_everything():
    seq = _seq(max_tokens=5)
    seq.num_computed_tokens = 5
    seq.append_token(40, 1.0)
    seq.num_computed_tokens = 6
    seq.append_token(41, 2.0)
    assert not seq.is_prefill and seq.num_uncomputed_tokens == 1
    seq.preempt()
    assert seq.status is SequenceStatus.PREEMPTED and seq.num_preemptions == 1
    assert seq.is_prefill and seq.num_uncomputed_tokens == 7 and seq.output_token_ids == [40, 41]


def test_batch_entries_know_whether_they_sample():
    seq = _seq(prompt_len=5)
    batch = Batch()
    chunk = batch.add(seq, 3)
    assert chunk == BatchEntry(seq, 0, 3, is_prefill=True, samples=False)
    seq.num_computed_tokens = 3
    assert BatchEntry.next_tokens(seq, 2).samples
    with pytest.raises(ValueError, match="cannot schedule 3 tokens"):
        BatchEntry.next_tokens(seq, 3)
    assert (batch.num_tokens, batch.num_prefill_tokens, batch.num_decode_tokens) == (3, 3, 0)


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="at least one token"):
        Sequence("e", [], SamplingParams(), 0.0, max_model_len=8)
