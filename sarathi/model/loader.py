"""`load_model`: a LlamaForCausalLM from an HF folder, a GGUF file, random weights, or the embedded model."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import torch

from sarathi.config import ModelConfig
from sarathi.model import kernels, quant_path_tuning
from sarathi.model.config import ModelArchConfig
from sarathi.model.gguf_loader import GGUFCheckpoint
from sarathi.model.linear import Linear
from sarathi.model.llama import LlamaForCausalLM
from sarathi.model.parallel import WHOLE_MODEL, ShardSpec, TensorParallelGroup
from sarathi.model.quantized import LOAD_TIME_FORMATS, WIDENED
from sarathi.model.resolve import resolve_model, serves_gguf_file
from sarathi.model.safetensors_folder import (
    MissingTensorError,
    SafetensorsCheckpoint,
)
from sarathi.model.weight_parts import TensorPart

logger = logging.getLogger(__name__)

DUMMY_INIT_STD = 0.02  # HF's default initializer_range


def resolve_compute_dtype(dtype: torch.dtype, compute_dtype: str) -> torch.dtype:
    """The matmul dtype for a config's `compute_dtype` name: 'auto' is bfloat16 for bf16 weights where our
    bf16 GEMM kernel runs (bf16 inputs, float32 accumulation), else float32."""
    if compute_dtype == "auto":
        return torch.bfloat16 if dtype == torch.bfloat16 and kernels.available() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[compute_dtype]


def effective_quantization(config: ModelConfig) -> str:
    """The quantization ``config`` serves: 'auto' is 'gguf' for a GGUF model with dtype 'auto' where our
    kernels run (the file's own bytes: less to stream per step, logits within the bf16 contract), else
    'none'."""
    if config.quantization != "auto":
        return config.quantization
    if config.dtype != "auto" or config.compute_dtype == "float32":
        return "none"
    if not serves_gguf_file(config.model, config.load_format):
        return "none"
    return "gguf" if kernels.portable_available() else "none"


def load_model(
    model: str | None,
    *,
    load_format: str = "auto",
    dtype: torch.dtype = torch.float32,
    compute_dtype: torch.dtype = torch.float32,
    hf_config: dict[str, Any] | None = None,
    seed: int = 0,
    shard: ShardSpec = WHOLE_MODEL,
    tp_group: TensorParallelGroup | None = None,
    quantization: str = "none",
) -> tuple[LlamaForCausalLM, ModelArchConfig, str | None]:
    """Load a model in eval mode; returns (model, arch config, folder holding the tokenizer or None).

    model: an HF folder (config.json + safetensors), a .gguf file, or None for the embedded SmolLM2.
    dtype: weights and KV cache; compute_dtype: matmul inputs and outputs (bfloat16 needs bfloat16 weights).
    load_format: 'auto' (by path), 'safetensors', 'gguf', or 'dummy' (random weights, deterministic by `seed`,
    for the config `hf_config`, else the folder's config.json).
    hf_config: replaces the folder's config.json when given (not used for GGUF).
    shard, tp_group: build and load only this rank's part of the model (see `LlamaForCausalLM`); each tensor
    is read as the slices the shard holds (GGUF: dequantized whole, then sliced). Dummy weights are the slices
    of the same full random model for every sharding.
    quantization: 'gguf' keeps a GGUF file's quantized linear layers in its blocks (packaged models are then
    read from their GGUF); tensors of other types are dequantized, with a notice naming them.
    """
    resolved = resolve_model(model, load_format, hf_config, quantization)
    arch, path = resolved.arch, resolved.path
    if quantization == "gguf" and resolved.load_format != "gguf":
        raise ValueError(f"quantization 'gguf' needs a GGUF file; {path} is {resolved.load_format}")
    if quantization in LOAD_TIME_FORMATS and not kernels.portable_available():
        raise ValueError(f"quantization {quantization!r} needs sarathi's CPU kernels, unavailable here")
    net = LlamaForCausalLM(arch, dtype, compute_dtype=compute_dtype, shard=shard, tp_group=tp_group)
    if resolved.load_format == "gguf":
        checkpoint = GGUFCheckpoint(path)
        net.load_hf_weights(checkpoint.fetch, checkpoint.quantized if quantization == "gguf" else None)
        if quantization == "gguf":
            _log_quantization(net)
    elif resolved.load_format == "dummy":
        init_dummy_weights(net, seed)
    else:
        net.load_hf_weights(SafetensorsCheckpoint(path).fetch)
    if quantization in LOAD_TIME_FORMATS:
        net.quantize_linear_layers(LOAD_TIME_FORMATS[quantization])
        _log_quantization(net)
    if net.quantized_layers():
        quant_path_tuning.apply()  # this machine's int8-path thresholds (timed once per machine)
    net.pack_weights()
    return net.eval(), arch, resolved.tokenizer_dir


def _log_quantization(net: LlamaForCausalLM) -> None:
    kept = net.quantized_layers()
    plain = [
        name
        for name, module in net.named_modules()
        if isinstance(module, Linear) and not module.quantized_formats
    ]
    logger.info("quantized layers: %s", ", ".join(f"{len(v)} {k}" for k, v in sorted(kept.items())))
    for qtype in sorted(kept.keys() & WIDENED.keys()):
        layout, ratio = WIDENED[qtype]
        logger.info(
            "%s weights held in the %s layout: the file's values, at %.2fx its bytes", qtype, layout, ratio
        )
    if plain:
        logger.warning("dequantized (no quantized kernel for their type or TP slice): %s", ", ".join(plain))


def hf_tensor_shapes(arch: ModelArchConfig) -> dict[str, tuple[int, ...]]:
    """Name and shape of every tensor of an HF checkpoint of this architecture."""
    hidden, hd, inter = arch.hidden_size, arch.head_dim, arch.intermediate_size
    q_rows, kv_rows = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (arch.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    for i in range(arch.num_hidden_layers):
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        linears = {
            f"{attn}q_proj": ((q_rows, hidden), arch.attention_bias),
            f"{attn}k_proj": ((kv_rows, hidden), arch.attention_bias),
            f"{attn}v_proj": ((kv_rows, hidden), arch.attention_bias),
            f"{attn}o_proj": ((hidden, q_rows), arch.o_proj_bias),
            f"{mlp}gate_proj": ((inter, hidden), arch.mlp_bias),
            f"{mlp}up_proj": ((inter, hidden), arch.mlp_bias),
            f"{mlp}down_proj": ((hidden, inter), arch.mlp_bias),
        }
        for name, (shape, bias) in linears.items():
            shapes[f"{name}.weight"] = shape
            if bias:
                shapes[f"{name}.bias"] = shape[:1]
        norms = {"input_layernorm": hidden, "post_attention_layernorm": hidden}
        if arch.sandwich_norms:
            norms |= {"pre_feedforward_layernorm": hidden, "post_feedforward_layernorm": hidden}
        if arch.qk_norm:
            norms |= {"self_attn.q_norm": hd, "self_attn.k_norm": hd}
        for norm, size in norms.items():
            shapes[f"model.layers.{i}.{norm}.weight"] = (size,)
    return shapes


class DummyCheckpoint:
    """A random HF checkpoint, HF-style: matrices ~ N(0, std), norms 1, biases 0.

    Each tensor comes from its own generator, seeded by (seed, tensor name): any shard of the model draws
    exactly the values the whole model has there, and the same seed always gives the same weights.
    """

    def __init__(self, arch: ModelArchConfig, seed: int, std: float = DUMMY_INIT_STD) -> None:
        self.shapes, self.seed, self.std = hf_tensor_shapes(arch), seed, std

    def get(self, name: str) -> torch.Tensor:
        """The whole tensor `name` (float32)."""
        shape = self.shapes.get(name)
        if shape is None:
            raise MissingTensorError(f"tensor {name!r} is not part of the model")
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        if name.endswith(".bias"):
            return torch.zeros(shape)
        digest = hashlib.blake2b(f"{self.seed}:{name}".encode(), digest_size=8).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        return torch.randn(shape, generator=gen) * self.std

    def fetch(self, part: TensorPart) -> torch.Tensor:
        """One part of a tensor (the whole tensor is drawn, then sliced)."""
        return part.take(self.get(part.name))


def init_dummy_weights(model: LlamaForCausalLM, seed: int, std: float = DUMMY_INIT_STD) -> None:
    """Fill the model (or its shard) with `DummyCheckpoint` weights; same seed -> same weights."""
    model.load_hf_weights(DummyCheckpoint(model.arch, seed, std).fetch)
