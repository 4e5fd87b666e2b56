"""Random HF checkpoints for tests: a config.json and model.safetensors of realistic scale, no download."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from sarathi.model import ModelArchConfig
from sarathi.model.loader import hf_tensor_shapes


def write_random_folder(config: dict[str, Any], folder: Path, seed: int = 0) -> ModelArchConfig:
    """An HF folder (config.json + model.safetensors) with random weights of realistic scale: matrices
    N(0, 1/fan_in), embeddings N(0, 1), random biases and norms, so that attention is far from uniform."""
    arch = ModelArchConfig.from_hf_config(config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in hf_tensor_shapes(arch).items():
        x = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):
            x = 1 + 0.2 * x
        elif name.endswith(".bias"):
            x = 0.2 * x
        elif name != "model.embed_tokens.weight":
            x = x * shape[1] ** -0.5
        tensors[name] = x
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return arch
