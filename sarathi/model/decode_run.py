"""What `decode_layers` (csrc/decode_layer.cpp) runs: consecutive Llama-family layers over decodes only, their
quantized GEMVs and fused steps in one call, and for the run that ends the model its final norm and LM head.
At one sequence the Python between a layer's kernels costs half as much again, and each layer's call and the
Python between layers ~20 us more. A run's weights are registered with the kernels once (`DecodeRun.number`).
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field

import torch

from sarathi.model import kernels
from sarathi.model.quantized import PackedQuant


def decode_layers(
    h: torch.Tensor,
    run: DecodeRun,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    window: int,
    logits_rows: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Consecutive Llama-family decoder layers over decodes only, h (float32 [T, hidden]) updated in place:
    the same kernels as the Python layers' fused path, in one call (`csrc/decode_layer.cpp`); one K and one
    V cache per layer of the run. With `logits_rows` (a run with the model's `head`): then the float32 logits
    of those rows, as the final norm's `rows` and the LM head compute them."""
    ops = torch.ops.sarathi_kernels
    return ops.decode_layers(
        h,
        run.number(ops),
        cos,
        sin,
        k_caches,
        v_caches,
        slot_mapping,
        block_tables,
        context_lens,
        window,
        logits_rows,
    )


@dataclass(frozen=True)
class DecodeHead:
    """The model's final norm (float32 weight, eps; `bf16`: rows rounded to bf16, as for bf16 math) and its
    quantized LM head (5 tensors and 6 ints per segment, as `DecodeLayerWeights.segments_of` gives them for
    one linear, and its output width), for the run of layers that ends the model."""

    norm: torch.Tensor
    eps: float
    bf16: bool
    tensors: list[torch.Tensor]
    segments: list[int]
    width: int

    @classmethod
    def of(cls, norm, lm_head) -> DecodeHead | None:
        """A model's final norm (RMSNorm) and LM head (Linear) as the last run's call takes them, or None
        where the kernels do not compute them as `RMSNorm.rows` and `Linear` would: the last pipeline stage
        only, a quantized head without bias, the norm's kernel (float32 or bf16 rows)."""
        if lm_head is None or norm is None or not lm_head.quantized_segments or lm_head.bias is not None:
            return None
        if norm.out_dtype not in (torch.float32, torch.bfloat16) or not kernels.portable_available():
            return None
        tensors, segments = DecodeLayerWeights.segments_of([lm_head.quantized_segments])
        bf16 = norm.out_dtype == torch.bfloat16
        return cls(norm.weight, norm.eps, bf16, tensors, segments, lm_head.out_features)


@dataclass(frozen=True)
class DecodeLayerWeights:
    """A layer's weights as `decode_layers` takes them: the norms (input, post-attention, then q and k with
    `qk_norm`, then pre- and post-feed-forward with `sandwich`); 5 tensors and 6 ints (linear, first row,
    rows, bits, sub, zero) per quantized segment of qkv, o, gate_up and down, and their output widths; `f32`:
    a float32 layer's steps (float32 results), else bf16 math's."""

    norms: list[torch.Tensor]
    tensors: list[torch.Tensor]
    segments: list[int]
    widths: list[int]
    heads: int
    head_dim: int
    eps: float
    gelu: bool
    qk_norm: bool
    sandwich: bool
    f32: bool = False

    @staticmethod
    def segments_of(linears: list[list[tuple[int, PackedQuant]]]) -> tuple[list[torch.Tensor], list[int]]:
        """The tensors and ints of each linear's (first row, weight) segments, in the order qkv, o, gate_up,
        down."""
        tensors: list[torch.Tensor] = []
        segments: list[int] = []
        for which, parts in enumerate(linears):
            for row, w in parts:
                tensors += [w.codes, w.d, w.sc, w.dm, w.mc]
                segments += [which, row, w.rows, w.bits, w.sub, w.zero]
        return tensors, segments


@dataclass(frozen=True)
class DecodeRun:
    """Consecutive layers' weights as one `decode_layers` call takes them: every layer's norms, tensors and
    segment ints in order, 5 layout ints per layer (its number of segments, then its 4 output widths); what
    the layers share (`shared`) as the first layer has it, and their attention scale."""

    norms: list[torch.Tensor]
    tensors: list[torch.Tensor]
    segments: list[int]
    layout: list[int]
    first: DecodeLayerWeights
    scale: float
    head: DecodeHead | None = None
    # the number a build's decode_layers knows this run by, per operator namespace (A/B builds have their own)
    _made: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def number(self, ops) -> int:
        """This run registered with `ops` (an operator namespace), once; released with this object. One int a
        call then, rather than ~20 weight tensors a layer converted on every call (~170 us a cold step)."""
        if ops.name not in self._made:
            f = self.first
            made = ops.decode_run_make(
                self.norms,
                self.tensors,
                self.segments,
                self.layout,
                f.heads,
                f.head_dim,
                self.scale,
                f.eps,
                f.gelu,
                f.qk_norm,
                f.sandwich,
                f.f32,
            )
            weakref.finalize(self, ops.decode_run_free, made).atexit = False
            if self.head is not None:
                head = self.head
                ops.decode_run_head(
                    made, head.norm, head.eps, head.bf16, head.tensors, head.segments, head.width
                )
            self._made[ops.name] = made
        return self._made[ops.name]

    @staticmethod
    def shared(layer: DecodeLayerWeights, scale: float) -> tuple:
        """What layers must have in common to run in one call."""
        return (
            layer.heads,
            layer.head_dim,
            scale,
            layer.eps,
            layer.gelu,
            layer.qk_norm,
            layer.sandwich,
            layer.f32,
        )

    @classmethod
    def of(cls, layers: list[DecodeLayerWeights], scale: float) -> DecodeRun:
        """One run of `layers` (sharing `shared`), with the attention `scale` they all use."""
        keys = {cls.shared(layer, scale) for layer in layers}
        if len(keys) != 1:
            raise ValueError(f"decode_layers: a run's layers differ in {sorted(map(str, keys))}")
        layout: list[int] = []
        for layer in layers:
            layout += [len(layer.tensors) // 5, *layer.widths]
        return cls(
            [t for layer in layers for t in layer.norms],
            [t for layer in layers for t in layer.tensors],
            [i for layer in layers for i in layer.segments],
            layout,
            layers[0],
            scale,
        )


def layer_runs(layers, layer_group: list[int], k_cache: torch.Tensor, head: DecodeHead | None) -> list[tuple]:
    """`layers` (DecoderLayers) as runs [start, end) of one KV-cache group (`layer_group[i]`): a run
    `decode_layers` takes in one call for a batch of decodes only (layers that compose there and share what
    `DecodeRun.shared` names), or a single layer (run None) that goes through its module. The last run, where
    it is one, also takes `head`."""
    runs: list[tuple[int, int, DecodeRun | None]] = []
    start, key, scale, members = 0, None, 1.0, []
    for i, layer in enumerate([*layers, None]):
        weights = None if layer is None else layer.decode_layer_weights(k_cache)
        this = None
        if weights is not None and layer.fused:
            this = (layer_group[i], DecodeRun.shared(weights, layer.self_attn.scale))
        if members and (this is None or this != key):  # the run so far ends here
            runs.append((start, i, DecodeRun.of(members, scale)))
            members = []
        if layer is not None and this is None:
            runs.append((i, i + 1, None))
        elif layer is not None:
            if not members:
                start, key, scale = i, this, layer.self_attn.scale
            members.append(weights)
    if runs and runs[-1][2] is not None and head is not None:  # the last run ends the model
        start, end, run = runs[-1]
        runs[-1] = (start, end, dataclasses.replace(run, head=head))
    return runs
