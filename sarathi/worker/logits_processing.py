"""Per-request logit controls applied to a batch of logit rows as tensors: logit_bias, repetition /
frequency / presence penalties, and min_p. Python only loops over requests (to gather their ids), never
over the vocabulary."""

from __future__ import annotations

import torch

from sarathi.sampling_params import SamplingParams


def apply_bias_and_penalties(
    logits: torch.Tensor, params: list[SamplingParams], steps: list[int], token_ids: list[list[int]] | None
) -> torch.Tensor:
    """``logits`` (float32, one row per request) with ``logit_bias`` added, then the repetition,
    frequency and presence penalties applied. ``token_ids[i]``: row ``i``'s prompt and output so far, of
    which the last ``steps[i]`` are output. Returns ``logits`` itself when no row asks for anything."""
    biased = [i for i, p in enumerate(params) if p.logit_bias]
    penalized = [i for i, p in enumerate(params) if p.penalized]
    if not biased and not penalized:
        return logits
    logits = logits.clone()  # the model's output may be an inference-mode tensor
    if biased:
        rows = [i for i in biased for _ in params[i].logit_bias]
        cols = [t for i in biased for t, _ in params[i].logit_bias]
        values = [v for i in biased for _, v in params[i].logit_bias]
        logits.index_put_((torch.tensor(rows), torch.tensor(cols)), torch.tensor(values), accumulate=True)
    if penalized:
        if token_ids is None:
            raise ValueError("penalties need the requests' token ids")
        for i in penalized:  # only the tokens a row has seen change: work in its history, not its vocabulary
            _penalize_row(logits[i], token_ids[i], steps[i], params[i])
    return logits


def _penalize_row(row: torch.Tensor, history: list[int], num_output: int, p: SamplingParams) -> None:
    """In place on one row: the repetition penalty on every token of prompt or output, then the frequency
    and presence penalties on the output's tokens by their counts."""
    ids = torch.tensor(history, dtype=torch.long)
    split = len(history) - num_output
    seen = ids.unique()
    if p.repetition_penalty != 1.0 and seen.numel():
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    out_ids, counts = ids[split:].unique(return_counts=True)
    if out_ids.numel() and (p.frequency_penalty or p.presence_penalty):
        row[out_ids] -= p.frequency_penalty * counts.float() + p.presence_penalty


def apply_min_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Rows with ``min_p`` > 0 (sampled, not greedy): tokens whose probability after the row's
    temperature is below ``min_p`` x the top token's get -inf."""
    rows = [i for i, p in enumerate(params) if p.min_p > 0 and not p.greedy]
    if not rows:
        return logits
    temperature = torch.tensor([params[i].temperature for i in rows]).unsqueeze(1)
    min_p = torch.tensor([params[i].min_p for i in rows]).unsqueeze(1)
    sub = logits[rows]
    probs = (sub / temperature).softmax(-1)
    drop = probs < min_p * probs.max(-1, keepdim=True).values
    logits = logits.clone()
    logits[rows] = sub.masked_fill(drop, float("-inf"))
    return logits
