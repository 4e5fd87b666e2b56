"""Helpers for the model tests: random HF reference models, a small paged-cache driver, error metrics."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from sarathi.model import SeqSlice, allocate_kv_cache, build_attention_metadata
from sarathi.model.config import ModelArchConfig
from sarathi.model.llama import LlamaForCausalLM

SMALL_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 96,
    "intermediate_size": 192,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 24,  # explicit, != hidden / heads
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
SMALL_LLAMA3_SCALED: dict[str, Any] = {
    **SMALL_LLAMA,
    "head_dim": 16,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "attention_bias": True,  # Llama's flag: bias on q, k, v and o
    "mlp_bias": True,
    "tie_word_embeddings": True,
}
SMALL_QWEN2: dict[str, Any] = {
    "model_type": "qwen2",
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}
_HF_CLASSES = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}


def make_random_hf_model(config: dict[str, Any], folder: Path, seed: int = 0) -> torch.nn.Module:
    """A transformers model of `config` with random weights of realistic scale, saved to `folder`.

    HF's init (std 0.02, zero biases, unit norms) gives near-uniform logits of ~0.1 that would hide errors;
    here every matrix is N(0, 1/fan_in) so activations keep unit scale and attention is not uniform, biases
    and norm weights are random, and the LM head is scaled so logits have a std of about 4.
    """
    cfg_class = transformers.AutoConfig.for_model(config["model_type"]).__class__
    hf_config = cfg_class(**{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = _HF_CLASSES[config["model_type"]](hf_config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif name == "model.embed_tokens.weight":
                p.normal_(0, 1.0)
            elif name == "lm_head.weight" and not hf_config.tie_word_embeddings:
                p.normal_(0, 4 / p.shape[1] ** 0.5)
            else:
                p.normal_(0, p.shape[1] ** -0.5)
    model.save_pretrained(folder)
    return model


def load_hf_reference(folder: str | Path, model_type: str) -> torch.nn.Module:
    """transformers' own implementation of a saved model, float32, eager attention, eval mode."""
    return (
        _HF_CLASSES[model_type]
        .from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
        .eval()
    )


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """float32 logits [len(tokens), vocab] of one full forward."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


@dataclass
class PagedRunner:
    """Drives our model like the engine does: shuffled block pool, per-sequence block tables, flat batches."""

    model: LlamaForCausalLM
    arch: ModelArchConfig
    block_size: int = 16
    num_blocks: int = 128
    seed: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kv = allocate_kv_cache(self.arch, self.num_blocks, self.block_size, self.model.dtype)
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
        logits = self.model(input_ids, meta.positions, meta, self.kv, torch.arange(len(input_ids)))
        return list(logits.split([len(tokens) for _, tokens, _ in entries]))

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


def max_abs_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest absolute difference."""
    return (ours.float() - ref.float()).abs().max().item()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """||ours - ref|| / ||ref|| (Frobenius)."""
    return ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
