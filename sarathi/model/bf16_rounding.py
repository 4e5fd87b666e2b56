"""Simulate bf16 roundings inside a float32 model, to tell which roundings a bf16 model's error comes from.

Used on transformers' reference models (their `nn.Linear` layers): the math stays float32 and only the
chosen tensors are rounded to the nearest bf16 value, so the resulting error is the least any bf16
implementation that rounds those tensors can have.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

KV_PROJECTIONS = ("k_proj", "v_proj")


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest bf16 value, kept in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


@torch.no_grad()
def round_weights_to_bf16(model: nn.Module) -> nn.Module:
    """Round every parameter of `model` to bf16 in place (values a bf16 copy of the model holds)."""
    for p in model.parameters():
        p.copy_(bf16_round(p))
    return model


def _round_first_input(_module: nn.Module, args: tuple) -> tuple:
    return (bf16_round(args[0]), *args[1:])


@contextmanager
def bf16_roundings(
    model: nn.Module, *, linear_inputs: bool = False, linear_outputs: bool = False, kv: bool = False
) -> Iterator[None]:
    """While active, round to bf16 every `nn.Linear` input and/or output, and/or only the k/v projections'
    outputs (what a bf16 KV cache stores)."""
    handles = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if linear_inputs:
            handles.append(module.register_forward_pre_hook(_round_first_input))
        if linear_outputs or (kv and name.endswith(KV_PROJECTIONS)):
            handles.append(module.register_forward_hook(lambda _m, _args, out: bf16_round(out)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
