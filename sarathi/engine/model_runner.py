"""Turns a scheduler ``Batch`` into flat tensors and runs the model: the one place Python becomes tensors."""

from __future__ import annotations

import torch

from sarathi.core.batch import Batch
from sarathi.core.block_manager import BlockManager
from sarathi.model import SeqSlice, build_attention_metadata


class ModelRunner:
    """Runs one batch through the model over the paged KV cache and returns the sampling rows' logits."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_manager: BlockManager,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_manager = block_manager
        self.device = torch.device(device)

    @torch.inference_mode()
    def execute(self, batch: Batch) -> torch.Tensor:
        """Logits (float32) for every entry with ``samples`` set, in batch order."""
        input_ids: list[int] = []
        positions: list[int] = []
        slices: list[SeqSlice] = []
        logits_indices: list[int] = []
        for entry in batch.entries:
            seq = entry.seq
            input_ids.extend(seq.token_slice(entry.start, entry.num_tokens))
            positions.extend(range(entry.start, entry.end))
            slices.append(SeqSlice(self.block_manager.block_table(seq.seq_id), entry.start, entry.num_tokens))
            if entry.samples:
                logits_indices.append(len(input_ids) - 1)
        metadata = build_attention_metadata(slices, self.block_manager.block_size, device=self.device)
        return self.model(
            torch.tensor(input_ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            metadata,
            self.kv_caches,
            torch.tensor(logits_indices, dtype=torch.long, device=self.device),
        )
