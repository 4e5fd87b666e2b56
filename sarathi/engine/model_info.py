"""What the engine knows of its model: read from the checkpoint by whoever builds the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """The model facts the engine's checks and bookkeeping need; the weights live in the workers."""

    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    tokenizer_dir: str | None = None
    #: The sliding window of each KV-cache group (None: global attention); see ``sarathi.core.kv_groups``.
    kv_group_windows: tuple[int | None, ...] = (None,)
