"""Architecture description of a Llama-family model, parsed from a Hugging Face ``config.json`` dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: 'linear' (position interpolation) or 'llama3' (Llama-3.1 band-wise scaling)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, d: dict[str, Any] | None) -> RopeScaling | None:
        """Parse an HF ``rope_scaling``/``rope_parameters`` dict; None or type 'default' means no scaling."""
        if not d:
            return None
        rope_type = d.get("rope_type", d.get("type", "default"))
        if rope_type not in _SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope scaling type {rope_type!r} (supported: {', '.join(_SUPPORTED_ROPE_TYPES)})"
            )
        if rope_type == "default":
            return None
        if "factor" not in d:
            raise ValueError(f"rope scaling {rope_type!r} needs a 'factor'")
        if rope_type == "linear":
            return cls(rope_type="linear", factor=float(d["factor"]))
        needed = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in needed if k not in d]
        if missing:
            raise ValueError(f"llama3 rope scaling is missing {', '.join(missing)}")
        return cls(
            rope_type="llama3",
            factor=float(d["factor"]),
            low_freq_factor=float(d["low_freq_factor"]),
            high_freq_factor=float(d["high_freq_factor"]),
            original_max_position_embeddings=int(d["original_max_position_embeddings"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """The HF ``rope_scaling`` dict for this scaling."""
        if self.rope_type == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        return {
            "rope_type": "llama3",
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }


@dataclass(frozen=True)
class ModelArchConfig:
    """Everything the model code needs to know about a Llama-family architecture."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on the q/k/v projections
    o_proj_bias: bool = False  # Llama's attention_bias also covers o_proj; Qwen2's q/k/v bias does not
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence token id (configs may list several)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_config(cls, d: dict[str, Any]) -> ModelArchConfig:
        """Parse an HF ``config.json`` dict (transformers 4.x or 5.x layout).

        Unsupported architectures or settings raise ValueError naming them.
        """
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r} (architectures={d.get('architectures')}); "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r} for {model_type} (only 'silu')")
        _reject_sliding_window(model_type, d)

        # transformers 5 stores rope_theta and the scaling inside rope_parameters; 4.x uses top-level keys.
        rope_params = d.get("rope_parameters") or {}
        rope_theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or rope_params

        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        is_qwen2 = model_type == "qwen2"
        llama_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return cls(
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=RopeScaling.from_hf(scaling),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=True if is_qwen2 else llama_bias,
            o_proj_bias=False if is_qwen2 else llama_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def to_hf_config(self) -> dict[str, Any]:
        """An HF ``config.json`` dict that transformers loads into its own class for this model_type."""
        d: dict[str, Any] = {
            "architectures": [_HF_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id if len(self.eos_token_ids) <= 1 else list(self.eos_token_ids),
            "initializer_range": 0.02,
            "torch_dtype": "float32",
            "use_cache": True,
        }
        if self.model_type == "qwen2":
            d["use_sliding_window"] = False
        else:
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = self.mlp_bias
        if self.model_type == "mistral":
            d["sliding_window"] = None
        return d


def _reject_sliding_window(model_type: str, d: dict[str, Any]) -> None:
    """Sliding-window attention is not implemented: refuse configs that would need it."""
    if model_type == "qwen2" and d.get("use_sliding_window"):
        raise ValueError("qwen2 with use_sliding_window=true is not supported")
    window = d.get("sliding_window")
    if model_type == "mistral" and window is not None and window < d.get("max_position_embeddings", 0):
        raise ValueError(f"mistral with sliding_window={window} is not supported (sliding-window attention)")
