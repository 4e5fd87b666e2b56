"""Architecture description of a supported decoder (Llama, Qwen2/3, Mistral, Gemma 3 text), parsed from a
Hugging Face ``config.json`` dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sarathi.core.kv_groups import KVCacheGroup, kv_cache_groups

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text")
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
_ACTIVATIONS = {"llama": "silu", "qwen2": "silu", "qwen3": "silu", "mistral": "silu"}
FULL, SLIDING = "full_attention", "sliding_attention"
_GEMMA3_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}  # transformers' defaults for Gemma 3
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
    """Everything the model code needs to know about a supported decoder architecture.

    The Llama layout is the base; the other families differ by the fields after `eos_token_ids`: per-head
    RMSNorm on q and k (Qwen3, Gemma 3), Gemma's "sandwich" norms around attention and MLP with `1 + weight`
    scales, a GELU-tanh MLP, scaled embeddings, and sliding-window attention on the layers `layer_types`
    marks, which rotate with their own RoPE base (`local_rope_theta`).
    """

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
    hidden_act: str = "silu"  # or "gelu_pytorch_tanh" (Gemma)
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE
    sandwich_norms: bool = False  # Gemma: norms after attention and MLP too (four per layer)
    norm_weight_offset: float = 0.0  # Gemma stores RMSNorm scales as weight - 1
    embedding_scale: float = 1.0  # Gemma multiplies embeddings by sqrt(hidden_size)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included
    layer_types: tuple[str, ...] = ()  # per layer FULL or SLIDING; empty: all FULL
    local_rope_theta: float | None = None  # RoPE base of sliding layers; None: rope_theta

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r} (silu, gelu_pytorch_tanh)")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types lists {len(self.layer_types)} layers, the model has {self.num_hidden_layers}"
            )
        if any(t not in (FULL, SLIDING) for t in self.layer_types):
            raise ValueError(f"unsupported layer type in {self.layer_types} ({FULL}, {SLIDING})")
        if SLIDING in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError("sliding_attention layers need a positive sliding_window")

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` (HF index) attends over a sliding window."""
        return bool(self.layer_types) and self.layer_types[layer] == SLIDING

    @property
    def kv_cache_groups(self) -> tuple[KVCacheGroup, ...]:
        """The layers' KV-cache groups: one per kind and share of layers (see ``sarathi.core.kv_groups``)."""
        return kv_cache_groups(
            [self.sliding_window if self.is_sliding(i) else None for i in range(self.num_hidden_layers)]
        )

    @property
    def has_sliding_layers(self) -> bool:
        """Whether any layer attends over a sliding window."""
        return SLIDING in self.layer_types

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
        if d.get("model_type") == "gemma3" and "text_config" in d:  # the multimodal wrapper: its text model
            d = {"model_type": "gemma3_text", **d["text_config"]}
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r} (architectures={d.get('architectures')}); "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        gemma = model_type == "gemma3_text"
        act = d.get("hidden_activation", "gelu_pytorch_tanh") if gemma else d.get("hidden_act", "silu")
        if act != _ACTIVATIONS.get(model_type, act):
            raise ValueError(f"unsupported hidden_act {act!r} for {model_type} (only 'silu')")
        if d.get("attn_logit_softcapping"):
            raise ValueError("attention logit soft-capping (attn_logit_softcapping) is not supported")
        if gemma and d.get("use_bidirectional_attention"):
            raise ValueError("gemma3 with use_bidirectional_attention is not supported")

        # transformers 5 stores rope_theta and the scaling inside rope_parameters (Gemma 3: one dict per layer
        # type); 4.x uses top-level keys.
        rope_params = d.get("rope_parameters") or {}
        local_params: dict[str, Any] = {}
        if gemma:
            if FULL in rope_params or SLIDING in rope_params:
                rope_params, local_params = rope_params.get(FULL) or {}, rope_params.get(SLIDING) or {}
            local_params = {
                "rope_theta": d.get("rope_local_base_freq", _GEMMA3_THETA[SLIDING]),
                **local_params,
            }
            if RopeScaling.from_hf(local_params) is not None:
                raise ValueError("rope scaling on Gemma 3's sliding layers is not supported")
        default_theta = _GEMMA3_THETA[FULL] if gemma else 10000.0
        rope_theta = d.get("rope_theta", rope_params.get("rope_theta", default_theta))
        scaling = d.get("rope_scaling") or rope_params

        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        num_layers = int(d["num_hidden_layers"])
        is_qwen2 = model_type == "qwen2"
        llama_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        window, layer_types = _sliding_layers(model_type, d, num_layers)
        head_dim = int(d.get("head_dim") or hidden // heads)
        return cls(
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=RopeScaling.from_hf(scaling),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),
            attention_bias=True if is_qwen2 else llama_bias,
            o_proj_bias=False if is_qwen2 else llama_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            hidden_act=act,
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            sandwich_norms=gemma,
            norm_weight_offset=1.0 if gemma else 0.0,
            embedding_scale=hidden**0.5 if gemma else 1.0,
            # transformers' Gemma3TextConfig default when a config leaves it out (not head_dim)
            attention_scale=float(d.get("query_pre_attn_scalar", 256)) ** -0.5 if gemma else None,
            final_logit_softcapping=d.get("final_logit_softcapping") if gemma else None,
            sliding_window=window,
            layer_types=layer_types,
            local_rope_theta=float(local_params["rope_theta"]) if gemma else None,
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
        if self.model_type in ("qwen2", "qwen3"):
            d["use_sliding_window"] = False
        if self.model_type != "qwen2":
            d["attention_bias"] = self.attention_bias
        if self.model_type in ("llama", "mistral"):
            d["mlp_bias"] = self.mlp_bias
        if self.model_type == "mistral":
            d["sliding_window"] = self.sliding_window
        if self.model_type == "gemma3_text":
            del d["hidden_act"]
            scaling = self.rope_scaling.to_hf() if self.rope_scaling else {"rope_type": "default"}
            d.update(
                hidden_activation=self.hidden_act,
                query_pre_attn_scalar=_whole_if_close(self.attention_scale**-2),
                sliding_window=self.sliding_window,
                layer_types=list(self.layer_types),
                final_logit_softcapping=self.final_logit_softcapping,
                attn_logit_softcapping=None,
                rope_scaling=None,
                rope_parameters={
                    FULL: {**scaling, "rope_theta": self.rope_theta},
                    SLIDING: {"rope_type": "default", "rope_theta": self.local_rope_theta},
                },
            )
            del d["rope_theta"]
        return d


def _whole_if_close(x: float) -> float | int:
    """x as an int when it is one up to rounding (configs type some scalars as ints)."""
    return round(x) if abs(x - round(x)) <= 1e-9 * abs(x) else x


def _sliding_layers(
    model_type: str, d: dict[str, Any], num_layers: int
) -> tuple[int | None, tuple[str, ...]]:
    """(window, per-layer types) from an HF config; (None, ()) when every layer attends globally."""
    window = d.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not d.get("use_sliding_window"):
        return None, ()
    if model_type == "llama" or not window or window >= d.get("max_position_embeddings", 1 << 62):
        return None, ()
    types = d.get("layer_types")
    if types is None:
        if model_type == "gemma3_text":
            pattern = int(d.get("sliding_window_pattern", 6))
            types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
        elif model_type in ("qwen2", "qwen3"):  # the first max_window_layers layers attend globally
            first = int(d.get("max_window_layers", num_layers))
            types = [SLIDING if i >= first else FULL for i in range(num_layers)]
        else:
            types = [SLIDING] * num_layers
    types = tuple(types)
    return (int(window), types) if SLIDING in types else (None, ())
