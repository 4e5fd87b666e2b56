"""ModelArchConfig parsing and the RoPE helpers."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from model_harness import SMALL_GEMMA3, SMALL_LLAMA, SMALL_LLAMA3_SCALED, SMALL_QWEN2
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from sarathi.model.config import FULL, SLIDING, ModelArchConfig, RopeScaling
from sarathi.model.rope import apply_rope, rope_cos_sin, rope_inv_freq

LLAMA31_HUB_STYLE = {  # transformers 4.x layout, as on the hub for Llama-3.1
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}


def test_llama31_hub_config() -> None:
    arch = ModelArchConfig.from_hf_config(LLAMA31_HUB_STYLE)
    assert (arch.head_dim, arch.num_queries_per_kv, arch.rope_theta) == (128, 4, 500000.0)
    assert arch.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert arch.eos_token_ids == (128001, 128008, 128009) and arch.eos_token_id == 128001
    assert not (arch.attention_bias or arch.o_proj_bias or arch.mlp_bias or arch.tie_word_embeddings)


def test_transformers5_layout_matches_4x_layout() -> None:
    """transformers 5 writes rope_theta and the scaling into rope_parameters."""
    v4 = ModelArchConfig.from_hf_config(SMALL_LLAMA3_SCALED)
    saved = transformers.LlamaConfig(**{k: v for k, v in SMALL_LLAMA3_SCALED.items() if k != "model_type"})
    v5_dict = saved.to_dict()
    assert "rope_parameters" in v5_dict
    v5 = ModelArchConfig.from_hf_config(v5_dict)
    assert (v5.rope_theta, v5.rope_scaling, v5.head_dim) == (v4.rope_theta, v4.rope_scaling, v4.head_dim)


def test_qwen2_has_qkv_bias_but_no_o_bias() -> None:
    arch = ModelArchConfig.from_hf_config(SMALL_QWEN2)
    assert arch.attention_bias and not arch.o_proj_bias
    assert arch.head_dim == SMALL_QWEN2["hidden_size"] // SMALL_QWEN2["num_attention_heads"]


def test_llama_attention_bias_covers_o_proj() -> None:
    arch = ModelArchConfig.from_hf_config(SMALL_LLAMA3_SCALED)
    assert arch.attention_bias and arch.o_proj_bias and arch.mlp_bias


@pytest.mark.parametrize("config", [SMALL_LLAMA, SMALL_LLAMA3_SCALED, SMALL_QWEN2, LLAMA31_HUB_STYLE])
def test_to_hf_config_round_trips(config) -> None:
    arch = ModelArchConfig.from_hf_config(config)
    assert ModelArchConfig.from_hf_config(arch.to_hf_config()) == arch


def test_unsupported_model_type_is_named() -> None:
    with pytest.raises(ValueError, match="'gpt2'"):
        ModelArchConfig.from_hf_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn'"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"hidden_act": "gelu"}, "'gelu'"),
        ({"num_key_value_heads": 4}, "multiple"),
    ],
)
def test_unsupported_settings_raise_clear_errors(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        ModelArchConfig.from_hf_config({**SMALL_LLAMA, **change})


def test_sliding_window_configs_mark_their_layers() -> None:
    qwen2 = ModelArchConfig.from_hf_config(
        {**SMALL_QWEN2, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1}
    )
    assert qwen2.sliding_window == 64 and qwen2.layer_types == (FULL, SLIDING, SLIDING)
    assert not ModelArchConfig.from_hf_config({**SMALL_QWEN2, "sliding_window": 64}).has_sliding_layers
    mistral = {**SMALL_LLAMA, "model_type": "mistral"}
    windowed = ModelArchConfig.from_hf_config({**mistral, "sliding_window": 64})
    assert windowed.is_sliding(0) and windowed.layer_types == (SLIDING,) * 3
    assert not ModelArchConfig.from_hf_config({**mistral, "sliding_window": None}).has_sliding_layers
    # a window as long as the context is no window
    assert not ModelArchConfig.from_hf_config({**mistral, "sliding_window": 512}).has_sliding_layers


def test_gemma3_config_reads_both_rope_bases_and_its_layer_pattern() -> None:
    arch = ModelArchConfig.from_hf_config({**SMALL_GEMMA3, "layer_types": None, "num_hidden_layers": 12})
    assert [arch.is_sliding(i) for i in range(12)] == [True] * 5 + [False] + [True] * 5 + [False]
    assert (arch.rope_theta, arch.local_rope_theta) == (1_000_000.0, 10_000.0)
    assert arch.attention_scale == 24**-0.5 and arch.embedding_scale == 96**0.5
    assert arch.qk_norm and arch.sandwich_norms and arch.norm_weight_offset == 1.0
    assert arch.tie_word_embeddings and arch.hidden_act == "gelu_pytorch_tanh"
    again = ModelArchConfig.from_hf_config(arch.to_hf_config())
    assert again == arch


def test_attention_softcapping_is_refused() -> None:
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        ModelArchConfig.from_hf_config({**SMALL_GEMMA3, "attn_logit_softcapping": 50.0})


def test_inv_freq_default_is_the_rope_formula() -> None:
    inv = rope_inv_freq(8, 10000.0)
    expected = torch.tensor([10000.0 ** (-i / 8) for i in (0, 2, 4, 6)])
    torch.testing.assert_close(inv, expected)
    torch.testing.assert_close(rope_inv_freq(8, 10000.0, RopeScaling("linear", 4.0)), expected / 4)


@pytest.mark.parametrize("original", [64, 8192])
def test_llama3_inv_freq_matches_transformers(original: int) -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }
    hf_cfg = transformers.LlamaConfig(
        hidden_size=512, num_attention_heads=4, head_dim=128, rope_theta=500000.0, rope_scaling=scaling
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg)
    ours = rope_inv_freq(128, 500000.0, RopeScaling.from_hf(scaling))
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    # The three bands all occur: untouched high frequencies, fully scaled low ones, blended middle ones.
    plain = rope_inv_freq(128, 500000.0)
    ratio = plain / ours
    assert ratio.min() == 1 and math.isclose(ratio.max().item(), 8.0, rel_tol=1e-6)
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


def test_apply_rope_matches_transformers() -> None:
    torch.manual_seed(0)
    t, heads, d = 11, 3, 16
    x = torch.randn(t, heads, d)
    positions = torch.randint(0, 1000, (t,))
    inv_freq = rope_inv_freq(d, 10000.0)
    ours = apply_rope(x, *rope_cos_sin(positions, inv_freq))
    # transformers wants [batch, heads, seq, d] and cos/sin of the angles repeated over both halves.
    angles = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], -1)[None]
    theirs, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], emb.cos(), emb.sin())
    torch.testing.assert_close(ours, theirs[0].transpose(0, 1), rtol=0, atol=1e-6)
    assert apply_rope(x.bfloat16(), *rope_cos_sin(positions, inv_freq)).dtype == torch.bfloat16
