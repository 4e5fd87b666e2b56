"""Reading a Hugging Face model folder: config.json plus one or more safetensors files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from sarathi.model.weight_parts import TensorPart

INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class MissingTensorError(KeyError):
    """A tensor the model needs is absent from the checkpoint."""

    def __str__(self) -> str:
        return str(self.args[0])


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's config.json as a dict; FileNotFoundError naming the path if it is missing."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model folder {folder} (expected {path})")
    with path.open() as f:
        return json.load(f)


def has_tokenizer(folder: str | Path) -> bool:
    """Whether the folder holds tokenizer files."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_FILES)


class SafetensorsCheckpoint:
    """Tensor lookup by HF name in a folder's safetensors files (one, sharded with an index, or several)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._file_of = self._map_tensors_to_files()
        self._handles: dict[Path, Any] = {}

    def _map_tensors_to_files(self) -> dict[str, Path]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            with index.open() as f:
                weight_map: dict[str, str] = json.load(f)["weight_map"]
            for shard in sorted(set(weight_map.values())):
                if not (self.folder / shard).is_file():
                    raise FileNotFoundError(f"shard {shard} named in {index} is missing")
            return {name: self.folder / shard for name, shard in weight_map.items()}
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(
                f"no *.safetensors files (and no {INDEX_FILE}) in model folder {self.folder}"
            )
        file_of: dict[str, Path] = {}
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                file_of.update(dict.fromkeys(f.keys(), path))
        return file_of

    def names(self) -> list[str]:
        """All tensor names in the checkpoint."""
        return list(self._file_of)

    def _handle(self, name: str) -> tuple[Path, Any]:
        path = self._file_of.get(name)
        if path is None:
            raise MissingTensorError(f"tensor {name!r} not found in the safetensors files of {self.folder}")
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = safe_open(str(path), framework="pt")
        return path, handle

    def get(self, name: str) -> torch.Tensor:
        """Load one tensor; MissingTensorError naming it (and the folder) if absent."""
        path, handle = self._handle(name)
        try:
            return handle.get_tensor(name)
        except Exception as e:  # the index names a tensor its shard does not contain
            raise MissingTensorError(f"tensor {name!r} not found in {path}: {e}") from e

    def fetch(self, part: TensorPart) -> torch.Tensor:
        """Load one part of a tensor, reading only that slice from the file."""
        if part.dim is None:
            return self.get(part.name)
        path, handle = self._handle(part.name)
        try:
            view = handle.get_slice(part.name)
        except Exception as e:
            raise MissingTensorError(f"tensor {part.name!r} not found in {path}: {e}") from e
        part.check_shape(view.get_shape())
        return view[part.index()]
