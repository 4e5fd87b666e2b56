"""Simulate bf16 roundings inside a float32 model, to tell which roundings a bf16 model's error comes from.

Used on transformers' reference models (their `nn.Linear` layers and module-level RoPE function): the math
stays float32 and only the chosen tensors are rounded to the nearest bf16 value, so the resulting error is the
least any bf16 implementation that rounds those tensors can have.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest bf16 value, kept in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


@torch.no_grad()
def round_weights_to_bf16(model: nn.Module, *, keep_norms: bool = False) -> nn.Module:
    """Round the parameters of `model` to bf16 in place (values a bf16 copy of the model holds); with
    `keep_norms`, all but the RMSNorm weights (which sarathi keeps in fp32 in every dtype)."""
    for name, p in model.named_parameters():
        if not (keep_norms and name.endswith("norm.weight")):
            p.copy_(bf16_round(p))
    return model


def _round_first_input(_module: nn.Module, args: tuple) -> tuple:
    return (bf16_round(args[0]), *args[1:])


@contextmanager
def bf16_roundings(
    model: nn.Module, *, linear_inputs: bool = False, linear_outputs: bool = False, kv: bool = False
) -> Iterator[None]:
    """While active, round to bf16 every `nn.Linear` input and/or output, and/or the keys and values a bf16
    KV cache stores (keys after RoPE, as a cache holds them; values as v_proj writes them)."""
    handles = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if linear_inputs:
            handles.append(module.register_forward_pre_hook(_round_first_input))
        if linear_outputs or (kv and name.endswith("v_proj")):
            handles.append(module.register_forward_hook(lambda _m, _args, out: bf16_round(out)))
    modeling = sys.modules[type(model).__module__]  # transformers' modeling_<arch> module
    original_rope = modeling.apply_rotary_pos_emb
    if kv:

        def rope_then_round_keys(q: torch.Tensor, k: torch.Tensor, *args, **kwargs):
            q, k = original_rope(q, k, *args, **kwargs)
            return q, bf16_round(k)

        modeling.apply_rotary_pos_emb = rope_then_round_keys
    try:
        yield
    finally:
        modeling.apply_rotary_pos_emb = original_rope
        for handle in handles:
            handle.remove()
