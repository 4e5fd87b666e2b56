"""Which checkpoint a model name means, its architecture and its tokenizer, without loading any weights.

The engine needs the architecture (vocabulary, context length, KV size per block) and the tokenizer
while the weights live in the workers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sarathi.config import LOAD_FORMATS
from sarathi.engine.model_info import ModelInfo
from sarathi.model.config import ModelArchConfig
from sarathi.model.embedded import (
    PACKAGED_MODELS,
    embedded_model_path,
    gguf_tokenizer_dir,
    packaged_model_path,
)
from sarathi.model.gguf_loader import GGUFCheckpoint
from sarathi.model.safetensors_folder import has_tokenizer, read_config
from sarathi.tokenizer import Tokenizer


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference made concrete: path (None for a config-only dummy model), format, arch, tokenizer."""

    path: Path | None
    load_format: str
    arch: ModelArchConfig
    tokenizer_dir: str | None


def serves_gguf_file(model: str | None, load_format: str = "auto") -> bool:
    """Whether ``model`` is read from a GGUF file: a .gguf path, a packaged model's name, or the embedded
    model (None), unless ``load_format`` says otherwise."""
    if load_format != "auto":
        return load_format == "gguf"
    if model is None:
        return True
    return model.endswith(".gguf") or (model in PACKAGED_MODELS and not Path(model).exists())


def resolve_model(
    model: str | None,
    load_format: str = "auto",
    hf_config: dict[str, Any] | None = None,
    quantization: str = "none",
) -> ResolvedModel:
    """model: an HF folder, a .gguf file, a packaged model's name (gemma3-270m, smollm2-135m), or None for the
    embedded SmolLM2 (or, with load_format 'dummy' and ``hf_config``, no files at all). Packaged models are
    read from their converted folder, or with ``quantization`` 'gguf' from their GGUF file (the tokenizer,
    chat template and end-of-turn ids still come from the folder). Raises ValueError / FileNotFoundError
    naming the problem."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r} (choose from {', '.join(LOAD_FORMATS)})")
    packaged = "smollm2-135m" if model is None and load_format != "dummy" else model
    named = packaged in PACKAGED_MODELS and (model is None or not Path(model).exists())
    if quantization == "gguf" and load_format in ("auto", "gguf") and named:
        folder = packaged_model_path(packaged)
        arch = ModelArchConfig.from_hf_config(read_config(Path(folder)))
        return ResolvedModel(PACKAGED_MODELS[packaged].gguf_path(), "gguf", arch, folder)
    if model is None and not (load_format == "dummy" and hf_config is not None):
        model = embedded_model_path()
    elif model in PACKAGED_MODELS and not Path(model).exists():
        model = packaged_model_path(model)
    path = Path(model) if model is not None else None
    if load_format == "auto":
        load_format = "gguf" if path is not None and path.suffix == ".gguf" else "safetensors"
    if load_format == "gguf":
        return ResolvedModel(path, load_format, GGUFCheckpoint(path).arch, gguf_tokenizer_dir(path))
    if path is not None and not path.is_dir():
        raise FileNotFoundError(f"model folder not found: {path}")
    tokenizer_dir = str(path) if path is not None and has_tokenizer(path) else None
    arch = ModelArchConfig.from_hf_config(hf_config if hf_config is not None else read_config(path))
    return ResolvedModel(path, load_format, arch, tokenizer_dir)


def model_info(resolved: ResolvedModel, tokenizer: Tokenizer | None) -> ModelInfo:
    """The engine's view of ``resolved``. EOS ids come from config.json, generation_config.json (chat models
    often add end-of-turn ids there) and the tokenizer; any of them ends a request unless ``ignore_eos``."""
    arch, folder = resolved.arch, resolved.tokenizer_dir
    ids = list(arch.eos_token_ids)
    gen_path = os.path.join(folder, "generation_config.json") if folder else None
    if gen_path and os.path.isfile(gen_path):
        with open(gen_path) as f:
            eos = json.load(f).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    eos_ids = tuple(dict.fromkeys(int(i) for i in ids))
    windows = tuple(g.window for g in arch.kv_cache_groups)
    return ModelInfo(arch.vocab_size, arch.max_position_embeddings, eos_ids, folder, windows)
