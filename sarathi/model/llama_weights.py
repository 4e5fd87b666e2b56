"""Which HF checkpoint tensors fill a `LlamaForCausalLM` (or one shard of it), and loading them: fused q/k/v
and gate/up layers cut from their parts by the shard's heads and columns, quantized blocks kept as such where
the checkpoint has them (GGUF), values everywhere else."""

from __future__ import annotations

import torch
from torch import nn

from sarathi.model.linear import Linear
from sarathi.model.quantized import quantize
from sarathi.model.weight_parts import Fetch, QuantizedFetch, TensorPart

# `model` below is a `sarathi.model.llama.LlamaForCausalLM`, typed as a module: that file imports this one.


def hf_weight_sources(model: nn.Module) -> dict[str, list[TensorPart]]:
    """For each parameter to load: the parts of HF checkpoint tensors concatenated (dim 0) to form it."""
    arch, shard = model.arch, model.shard
    sources: dict[str, list[TensorPart]] = {}
    if model.embed_tokens is not None:
        sources["embed_tokens.weight"] = [TensorPart("model.embed_tokens.weight")]
    if model.lm_head is not None:
        sources["norm.weight"] = [TensorPart("model.norm.weight")]
        if not arch.tie_word_embeddings:
            sources["lm_head.weight"] = [TensorPart("lm_head.weight")]
        elif model.embed_tokens is None:  # tied, but the embedding lives in another stage's process
            sources["lm_head.weight"] = [TensorPart("model.embed_tokens.weight")]
    row_bias = shard.tp_rank == 0  # a row-parallel layer's bias is added once to the sum over TP ranks
    has_bias = {
        "self_attn.qkv_proj": arch.attention_bias,
        "self_attn.o_proj": arch.o_proj_bias and row_bias,
        "mlp.gate_up_proj": arch.mlp_bias,
        "mlp.down_proj": arch.mlp_bias and row_bias,
    }
    for j in range(len(model.layers)):
        ours, hf = f"layers.{j}.", f"model.layers.{model.first_layer + j}."
        for name, bias in has_bias.items():
            sources[f"{ours}{name}.weight"] = _linear_parts(model, hf, name, "weight")
            if bias:
                sources[f"{ours}{name}.bias"] = _linear_parts(model, hf, name, "bias")
        norms = ["input_layernorm", "post_attention_layernorm"]
        if arch.sandwich_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        if arch.qk_norm:
            norms += ["self_attn.q_norm", "self_attn.k_norm"]
        for norm in norms:
            sources[f"{ours}{norm}.weight"] = [TensorPart(f"{hf}{norm}.weight")]
    return sources


def _linear_parts(model: nn.Module, hf: str, name: str, suffix: str) -> list[TensorPart]:
    """The HF parts of one (fused) linear layer's weight or bias in this TP rank's shard."""
    arch, shard, hd = model.arch, model.shard, model.arch.head_dim
    q0, q1 = shard.q_head_range(arch.num_attention_heads, arch.num_key_value_heads)
    kv0, kv1 = shard.kv_head_range(arch.num_key_value_heads)
    c0, c1 = shard.column_range(arch.intermediate_size)
    q_rows, kv_rows = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
    inter = arch.intermediate_size
    if name == "self_attn.qkv_proj":  # column-parallel: output rows of this rank's heads
        return [
            TensorPart.of(f"{hf}self_attn.q_proj.{suffix}", 0, q0 * hd, q1 * hd, q_rows),
            TensorPart.of(f"{hf}self_attn.k_proj.{suffix}", 0, kv0 * hd, kv1 * hd, kv_rows),
            TensorPart.of(f"{hf}self_attn.v_proj.{suffix}", 0, kv0 * hd, kv1 * hd, kv_rows),
        ]
    if name == "mlp.gate_up_proj":
        return [TensorPart.of(f"{hf}mlp.{p}_proj.{suffix}", 0, c0, c1, inter) for p in ("gate", "up")]
    if suffix == "bias":  # row-parallel layers keep their whole bias
        return [TensorPart(f"{hf}{name}.bias")]
    if name == "self_attn.o_proj":  # row-parallel: input columns of this rank's heads
        return [TensorPart.of(f"{hf}self_attn.o_proj.weight", 1, q0 * hd, q1 * hd, q_rows)]
    return [TensorPart.of(f"{hf}mlp.down_proj.weight", 1, c0, c1, inter)]


@torch.no_grad()
def load_hf_weights(model: nn.Module, fetch: Fetch, quantized: QuantizedFetch | None = None) -> None:
    """Fill every parameter from parts of HF tensors; `fetch(part)` returns that part (any dtype) or
    raises KeyError. Only this shard's slices are requested.

    With `quantized`, a linear layer whose parts it all returns (not None) keeps them quantized; the
    others and the norms are fetched as values. So is the token table, unless its blocks are quantized
    too: then it is kept in them, and a tied LM head is the same packed weight, held once."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    sources = hf_weight_sources(model)
    tied_here = model.arch.tie_word_embeddings and "lm_head.weight" not in sources
    if quantized is not None and tied_here and model.lm_head is not None:
        sources["lm_head.weight"] = [TensorPart("model.embed_tokens.weight")]
    if quantized is not None and model.embed_tokens is not None:
        table = quantized(TensorPart("model.embed_tokens.weight"))
        if table is not None:
            del sources["embed_tokens.weight"]
            if tied_here and model.lm_head is not None:
                del sources["lm_head.weight"]
                model.lm_head.load_quantized([table])
                model.embed_tokens.share_quantized(model.lm_head.quantized_weight, table.qtype)
            else:
                model.embed_tokens.load_quantized(table)
    for name, parts in sources.items():
        module = modules.get(name.rpartition(".")[0])
        if quantized is not None and isinstance(module, Linear) and name.endswith(".weight"):
            blocks = [quantized(p) for p in parts]
            if all(b is not None for b in blocks):
                module.load_quantized(blocks)
                continue
        param = params.get(name)
        if param is None:  # the tied LM head, not quantizable: it stays the embedding
            continue
        tensor = torch.cat([fetch(p) for p in parts]) if len(parts) > 1 else fetch(parts[0])
        if "norm" in name and model.arch.norm_weight_offset:  # Gemma's checkpoints store scale - 1
            tensor = tensor.float() + model.arch.norm_weight_offset
        if tensor.shape != param.shape:
            raise ValueError(
                f"tensor {' + '.join(map(str, parts))} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(param.shape)}"
            )
        param.copy_(tensor)


@torch.no_grad()
def quantize_linear_layers(model: nn.Module, qtype: str) -> None:
    """Quantize every linear layer's loaded weight to `qtype` blocks (layers whose width is not a whole
    number of blocks stay as they are)."""
    for module in model.modules():
        if isinstance(module, Linear) and module.weight is not None:
            blocks = quantize(module.weight.detach(), qtype)
            if blocks is not None:
                module.load_quantized([blocks])
