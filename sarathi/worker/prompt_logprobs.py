"""Prompt log probabilities from a prefill chunk's logits: each prompt token's log probability given the
tokens before it, its rank and the most likely alternatives, for the whole batch at once."""

from __future__ import annotations

import torch

from sarathi.engine.step_messages import PromptLogprobs
from sarathi.outputs import TokenLogprob
from sarathi.worker.model_runner import PromptRows


def score_prompt_rows(logits: torch.Tensor, rows: tuple[PromptRows, ...]) -> list[PromptLogprobs]:
    """``logits`` has one row per scored prompt token, in the order of ``rows``' tokens."""
    if not rows:
        return []
    targets = torch.tensor([t for r in rows for t in r.next_token_ids], device=logits.device)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, targets[:, None])
    ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
    chosen = chosen[:, 0].tolist()
    top_k = max(r.top_k for r in rows)
    top_values = top_ids = None
    if top_k:
        top_values, top_ids = (x.tolist() for x in logprobs.topk(top_k, dim=-1))
    out, i = [], 0
    for r in rows:
        entries = []
        for token_id in r.next_token_ids:
            top = ()
            if r.top_k:
                top = tuple(zip(top_ids[i][: r.top_k], top_values[i][: r.top_k], strict=True))
            entries.append(TokenLogprob(token_id, chosen[i], top, ranks[i]))
            i += 1
        out.append(PromptLogprobs(r.request_id, r.start, entries))
    return out
