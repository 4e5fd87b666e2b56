"""PagedRunner: drives our model over a paged KV cache like the engine does (no transformers import, so that
spawned test workers start fast)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from sarathi.model import SeqSlice, allocate_kv_cache, build_attention_metadata
from sarathi.model.config import ModelArchConfig
from sarathi.model.llama import LlamaForCausalLM
from sarathi.model.parallel import WHOLE_MODEL, ParallelContext, ShardSpec


@dataclass
class PagedRunner:
    """Drives our model like the engine does: shuffled block pool, per-sequence block tables, flat batches.

    For a model shard, `shard` sizes its KV cache and `pipeline` carries hidden states between stages: every
    rank runs the same calls (same block tables), and only the last stage gets logits (others get []).
    """

    model: LlamaForCausalLM
    arch: ModelArchConfig
    block_size: int = 16
    num_blocks: int = 128
    seed: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)
    shard: ShardSpec = WHOLE_MODEL
    pipeline: ParallelContext | None = None

    def __post_init__(self) -> None:
        self.kv = allocate_kv_cache(
            self.arch, self.num_blocks, self.block_size, self.model.dtype, shard=self.shard
        )
        self.free = list(range(self.num_blocks))
        random.Random(self.seed).shuffle(self.free)  # block tables come out non-contiguous and unordered

    def run(self, entries: list[tuple[str, list[int], int]]) -> list[torch.Tensor]:
        """One forward of entries (seq id, new tokens, start position): per entry, logits of its tokens."""
        slices = []
        for seq, tokens, start in entries:
            table = self.tables.setdefault(seq, [])
            while len(table) * self.block_size < start + len(tokens):
                table.append(self.free.pop())
            slices.append(SeqSlice(list(table), start, len(tokens)))
        meta = build_attention_metadata(slices, self.block_size)
        input_ids = torch.tensor([t for _, tokens, _ in entries for t in tokens])
        hidden = None
        if not self.shard.is_first_stage:
            shape = (len(input_ids), self.arch.hidden_size)
            hidden = self.pipeline.recv_from_prev_stage(shape, torch.float32)
        out = self.model(input_ids, meta.positions, meta, self.kv, torch.arange(len(input_ids)), hidden)
        if not self.shard.is_last_stage:
            self.pipeline.send_to_next_stage(out)
            return []
        return list(out.split([len(tokens) for _, tokens, _ in entries]))

    def prefill(self, seq: str, tokens: list[int], chunk: int) -> torch.Tensor:
        """Prefill `tokens` from position 0 in chunks of `chunk`, a forward each; logits at all positions."""
        outs = [self.run([(seq, tokens[i : i + chunk], i)])[0] for i in range(0, len(tokens), chunk)]
        return torch.cat(outs)

    def greedy_decode(
        self, seq: str, tokens: list[int], last_logits: torch.Tensor, steps: int
    ) -> tuple[list[int], torch.Tensor]:
        """`steps` greedy decode steps after `tokens`; returns (extended tokens, logits of each step)."""
        tokens = list(tokens)
        step_logits = []
        for _ in range(steps):
            tokens.append(int(last_logits.argmax()))
            last_logits = self.run([(seq, tokens[-1:], len(tokens) - 1)])[0][0]
            step_logits.append(last_logits)
        return tokens, torch.stack(step_logits)
