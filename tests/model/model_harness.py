"""Helpers for the model tests: random HF reference models, a small paged-cache driver, error metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from paged_runner import PagedRunner as PagedRunner  # re-exported: the tests import it from here

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
SMALL_QWEN3: dict[str, Any] = {**SMALL_QWEN2, "model_type": "qwen3", "head_dim": 32}  # no biases, QK-norm
# Gemma 3 at a small window, so that 100-token prompts in chunks of 1-64 cross it; one kv head as in the
# 270M model, a query_pre_attn_scalar unlike head_dim, and final logit soft-capping exercised.
SMALL_GEMMA3: dict[str, Any] = {
    "model_type": "gemma3_text",
    "vocab_size": 320,
    "hidden_size": 96,
    "intermediate_size": 192,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "query_pre_attn_scalar": 24,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "sliding_window": 16,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
}
SMALL_MISTRAL_SLIDING: dict[str, Any] = {**SMALL_LLAMA, "model_type": "mistral", "sliding_window": 16}
_HF_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "gemma3_text": transformers.Gemma3ForCausalLM,
}


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


def max_abs_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest absolute difference."""
    return (ours.float() - ref.float()).abs().max().item()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """||ours - ref|| / ||ref|| (Frobenius)."""
    return ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
