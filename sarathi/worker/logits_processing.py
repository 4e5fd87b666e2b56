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
        vocab = logits.shape[1]
        histories = [token_ids[i] for i in penalized]
        splits = [len(h) - steps[i] for h, i in zip(histories, penalized, strict=True)]
        counts = _token_counts([h[s:] for h, s in zip(histories, splits, strict=True)], vocab)
        in_prompt = _token_counts([h[:s] for h, s in zip(histories, splits, strict=True)], vocab) > 0
        rep = torch.tensor([params[i].repetition_penalty for i in penalized]).unsqueeze(1)
        freq = torch.tensor([params[i].frequency_penalty for i in penalized]).unsqueeze(1)
        pres = torch.tensor([params[i].presence_penalty for i in penalized]).unsqueeze(1)
        sub = logits[penalized]
        seen = in_prompt | (counts > 0)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        sub = sub - freq * counts - pres * (counts > 0).float()
        logits[penalized] = sub
    return logits


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


def _token_counts(seqs: list[list[int]], vocab: int) -> torch.Tensor:
    """(len(seqs), vocab) float32: how often each token id occurs in each sequence."""
    width = max((len(s) for s in seqs), default=0) or 1
    ids = torch.tensor([s + [vocab] * (width - len(s)) for s in seqs], dtype=torch.long)
    counts = torch.zeros(len(seqs), vocab + 1).scatter_add_(1, ids, torch.ones(ids.shape))
    return counts[:, :vocab]
