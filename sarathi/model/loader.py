"""`load_model`: a LlamaForCausalLM from an HF folder, a GGUF file, random weights, or the embedded model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sarathi.model.config import ModelArchConfig
from sarathi.model.embedded import embedded_model_path, gguf_tokenizer_dir
from sarathi.model.gguf_loader import GGUFCheckpoint
from sarathi.model.llama import LlamaForCausalLM
from sarathi.model.safetensors_folder import SafetensorsCheckpoint, has_tokenizer, read_config

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DUMMY_INIT_STD = 0.02  # HF's default initializer_range


def load_model(
    model: str | None,
    *,
    load_format: str = "auto",
    dtype: torch.dtype = torch.float32,
    compute_dtype: torch.dtype = torch.float32,
    hf_config: dict[str, Any] | None = None,
    seed: int = 0,
) -> tuple[LlamaForCausalLM, ModelArchConfig, str | None]:
    """Load a model in eval mode; returns (model, arch config, folder holding the tokenizer or None).

    model: an HF folder (config.json + safetensors), a .gguf file, or None for the embedded SmolLM2.
    dtype: weights and KV cache; compute_dtype: matmul inputs and outputs (bfloat16 needs bfloat16 weights).
    load_format: 'auto' (by path), 'safetensors', 'gguf', or 'dummy' (random weights, deterministic by `seed`,
    for the config `hf_config`, else the folder's config.json).
    hf_config: replaces the folder's config.json when given (not used for GGUF).
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r} (choose from {', '.join(LOAD_FORMATS)})")
    if model is None and not (load_format == "dummy" and hf_config is not None):
        model = embedded_model_path()
    path = Path(model) if model is not None else None
    if load_format == "auto":
        load_format = "gguf" if path is not None and path.suffix == ".gguf" else "safetensors"

    tokenizer_dir = str(path) if path is not None and path.is_dir() and has_tokenizer(path) else None
    if load_format == "gguf":
        ckpt = GGUFCheckpoint(path)
        arch = ckpt.arch
        net = LlamaForCausalLM(arch, dtype, compute_dtype=compute_dtype)
        net.load_hf_weights(ckpt.get)
        tokenizer_dir = gguf_tokenizer_dir(path)
    else:
        if path is not None and not path.is_dir():
            raise FileNotFoundError(f"model folder not found: {path}")
        arch = ModelArchConfig.from_hf_config(hf_config if hf_config is not None else read_config(path))
        net = LlamaForCausalLM(arch, dtype, compute_dtype=compute_dtype)
        if load_format == "dummy":
            init_dummy_weights(net, seed)
        else:
            net.load_hf_weights(SafetensorsCheckpoint(path).get)
    net.pack_weights()
    return net.eval(), arch, tokenizer_dir


@torch.no_grad()
def init_dummy_weights(model: LlamaForCausalLM, seed: int, std: float = DUMMY_INIT_STD) -> None:
    """HF-style random init: matrices ~ N(0, std), norms 1, biases 0; same seed -> same weights."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * std)
