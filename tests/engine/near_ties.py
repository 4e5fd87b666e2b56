"""The greedy-equality rule of the engine tests: equal token ids, except after a proven near-tie."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


def check_same(
    prompts: list[list[int]],
    expected: list[list[int]],
    got: list[list[int]],
    reference_model: Callable[[], torch.nn.Module],
    label: str,
    near_tie: float,
) -> int:
    """Assert equal token ids, except where at the first differing step both tokens are within `near_tie`
    of the reference model's best logit (a tie of two, or of three or more close candidates; comparison of
    that prompt stops there); returns how many prompts diverged. `reference_model()` is called only on a
    difference."""
    diverged = 0
    for i, (prompt, exp, out) in enumerate(zip(prompts, expected, got, strict=True)):
        assert len(out) == len(exp), f"{label}: prompt {i} produced {len(out)} tokens, expected {len(exp)}"
        diff = next((j for j, (a, b) in enumerate(zip(exp, out, strict=True)) if a != b), None)
        if diff is None:
            continue
        with torch.inference_mode():
            logits = reference_model()(torch.tensor([prompt + exp[:diff]])).logits[0, -1]
        best = float(logits.max())
        gap = max(best - float(logits[exp[diff]]), best - float(logits[out[diff]]))
        top3 = torch.topk(logits, 3)
        assert gap < near_tie, (
            f"{label}: prompt {i} (length {len(prompt)}) differs at output step {diff}: "
            f"expected {exp[diff]}, got {out[diff]}, {gap:.2e} below the best logit, no near-tie "
            f"(top-3 {top3.indices.tolist()}: {[round(v, 4) for v in top3.values.tolist()]})"
        )
        warnings.warn(f"{label}: prompt {i} took the other side of a near-tie (gap {gap:.1e})", stacklevel=2)
        diverged += 1
    return diverged
