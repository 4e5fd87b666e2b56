"""The shapes of a model the analytic latency model costs, read from an HF ``config.json`` (no weights).

Pure Python. Shipped specs (``data/models/*.json``) are the paper's models: Mistral-7B, Yi-34B, Llama-2-70B
and Falcon-180B. A spec gives parameter counts per layer and per tensor-parallel shard, the KV bytes per
token, the KV blocks that fit next to the weights on a GPU (``kv_cache_blocks``), and a Llama-type config the
engine can build its scheduler and block manager from with ``load_format="dummy"`` (``engine_hf_config``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sarathi.simulator.hardware import GIB, Hardware

MODELS_DIR = Path(__file__).parent / "data" / "models"

# What a GPU holds besides weights and KV cache at its peak: CUDA context, cuBLAS workspaces, NCCL buffers.
RUNTIME_RESERVE_BYTES = 1 * GIB
# Sequences whose logits the memory profile samples at once (vLLM's default max_num_seqs).
PROFILE_NUM_SEQS = 256


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shapes: everything its cost depends on, nothing of its weights.

    ``gated_mlp``: a SwiGLU MLP (gate, up and down projections) rather than a plain up/down one;
    ``parallel_attention``: attention and MLP read the same input and are summed (Falcon), so tensor
    parallelism needs one all-reduce per layer instead of two.
    """

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    gated_mlp: bool = True
    parallel_attention: bool = False
    tie_word_embeddings: bool = False
    norms_per_layer: int = 2
    norm_has_bias: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads do not form groups over {self.num_kv_heads} kv heads")

    # --- loading -----------------------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, d: dict[str, Any], name: str) -> ModelSpec:
        """From an HF ``config.json`` dict: Llama, Mistral, Qwen2/3, Gemma 3 text or Falcon (ValueError for
        others)."""
        model_type = d.get("model_type")
        if model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text"):
            return cls._from_llama_like(d, name, model_type)
        if model_type == "falcon":
            return cls._from_falcon(d, name)
        raise ValueError(
            f"no model spec for model_type {model_type!r} (llama, mistral, qwen2, qwen3, gemma3_text, falcon)"
        )

    @classmethod
    def _from_llama_like(cls, d: dict[str, Any], name: str, model_type: str) -> ModelSpec:
        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        attention_bias = bool(d.get("attention_bias", False))
        rope = d.get("rope_theta", (d.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        gemma = model_type == "gemma3_text"
        return cls(
            name=name,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            vocab_size=int(d["vocab_size"]),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),
            norms_per_layer=4 if gemma else 2,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            rope_theta=float(rope),
            norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            sliding_window=d.get("sliding_window") if model_type in ("mistral", "gemma3_text") else None,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=_first(d.get("eos_token_id")),
        )

    @classmethod
    def _from_falcon(cls, d: dict[str, Any], name: str) -> ModelSpec:
        if d.get("alibi"):
            raise ValueError("Falcon with ALiBi is not modelled (only rotary embeddings)")
        hidden, heads = int(d["hidden_size"]), int(d.get("num_attention_heads", d.get("n_head", 0)))
        new_arch = bool(d.get("new_decoder_architecture", False))
        parallel = bool(d.get("parallel_attn", True))
        if new_arch:
            kv_heads = int(d.get("num_kv_heads") or heads)
        else:
            kv_heads = 1 if d.get("multi_query", True) else heads
        bias = bool(d.get("bias", False))
        return cls(
            name=name,
            model_type="falcon",
            hidden_size=hidden,
            intermediate_size=int(d.get("ffn_hidden_size") or 4 * hidden),
            num_layers=int(d.get("num_hidden_layers", d.get("n_layer", 0))),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=hidden // heads,
            vocab_size=int(d["vocab_size"]),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            gated_mlp=False,
            parallel_attention=parallel,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
            norms_per_layer=2 if new_arch or not parallel else 1,
            norm_has_bias=True,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            rope_theta=float(d.get("rope_theta", 10000.0)),
            norm_eps=float(d.get("layer_norm_epsilon", 1e-5)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=_first(d.get("eos_token_id")),
        )

    @classmethod
    def load(cls, name_or_path: str | Path) -> ModelSpec:
        """A shipped spec by short name (``yi-34b``), a ``config.json`` path, or an HF model folder."""
        path = Path(name_or_path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            shipped = MODELS_DIR / f"{str(name_or_path).lower()}.json"
            if not shipped.is_file():
                raise ValueError(
                    f"no model spec {str(name_or_path)!r}: not a config.json or model folder, "
                    f"nor one of {', '.join(available_models())}"
                )
            path = shipped
        name = path.parent.name if path.name == "config.json" else path.stem
        return cls.from_hf_config(json.loads(path.read_text()), name)

    # --- shapes per tensor-parallel shard ----------------------------------------------------------------
    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """Key/value heads one TP rank holds (replicated when there are fewer heads than ranks)."""
        return _ceil_div(self.num_kv_heads, tp)

    def heads_per_gpu(self, tp: int = 1) -> int:
        """Query heads one TP rank holds (the most any rank holds)."""
        if self.num_kv_heads >= tp:
            return self.kv_heads_per_gpu(tp) * (self.num_heads // self.num_kv_heads)
        return _ceil_div(self.num_heads, tp)

    def intermediate_per_gpu(self, tp: int = 1) -> int:
        """MLP intermediate columns one TP rank holds."""
        return _ceil_div(self.intermediate_size, tp)

    def vocab_per_gpu(self, tp: int = 1) -> int:
        """Vocabulary rows of the embedding and LM head one TP rank holds."""
        return _ceil_div(self.vocab_size, tp)

    # --- parameter counts --------------------------------------------------------------------------------
    def attention_params(self, tp: int = 1) -> int:
        """One layer's q/k/v/o projection parameters on one TP rank (biases included)."""
        q = self.heads_per_gpu(tp) * self.head_dim
        kv = self.kv_heads_per_gpu(tp) * self.head_dim
        qkv = self.hidden_size * (q + 2 * kv) + (q + 2 * kv if self.qkv_bias else 0)
        o = q * self.hidden_size + (self.hidden_size if self.o_bias else 0)
        return qkv + o

    def mlp_params(self, tp: int = 1) -> int:
        """One layer's MLP parameters on one TP rank: gate/up/down (gated) or up/down."""
        inter = self.intermediate_per_gpu(tp)
        up = (2 if self.gated_mlp else 1) * (self.hidden_size * inter + (inter if self.mlp_bias else 0))
        down = inter * self.hidden_size + (self.hidden_size if self.mlp_bias else 0)
        return up + down

    def norm_params(self) -> int:
        """One layer's normalisation parameters (replicated on every TP rank)."""
        return self.norms_per_layer * self.hidden_size * (2 if self.norm_has_bias else 1)

    def layer_params(self, tp: int = 1) -> int:
        """One decoder layer's parameters on one TP rank."""
        return self.attention_params(tp) + self.mlp_params(tp) + self.norm_params()

    def embedding_params(self, tp: int = 1) -> int:
        """The token embedding's parameters on one TP rank (vocabulary-parallel)."""
        return self.vocab_per_gpu(tp) * self.hidden_size

    def lm_head_params(self, tp: int = 1) -> int:
        """The LM head's parameters on one TP rank (the embedding's when tied: stored once on one GPU)."""
        return self.vocab_per_gpu(tp) * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters of the model."""
        final_norm = self.hidden_size * (2 if self.norm_has_bias else 1)
        head = 0 if self.tie_word_embeddings else self.lm_head_params()
        return self.num_layers * self.layer_params() + self.embedding_params() + head + final_norm

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int = 2) -> int:
        """Bytes of K and V one token costs in one layer on one TP rank."""
        return 2 * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes

    def layers_per_stage(self, pp: int) -> list[int]:
        """Decoder layers of each of ``pp`` pipeline stages: contiguous, even, earlier stages taking the
        remainder (as the engine splits them)."""
        if not 1 <= pp <= self.num_layers:
            raise ValueError(f"cannot split {self.num_layers} layers into {pp} pipeline stages")
        base, extra = divmod(self.num_layers, pp)
        return [base + (stage < extra) for stage in range(pp)]

    def stage_weight_params(self, tp: int, pp: int, stage: int) -> int:
        """Parameters one GPU of pipeline stage ``stage`` holds: its layers' shard, plus the embedding on
        the first stage and the LM head on the last (once when tied and both are on one stage)."""
        params = self.layers_per_stage(pp)[stage] * self.layer_params(tp)
        if stage == 0:
            params += self.embedding_params(tp)
        if stage == pp - 1:
            params += self.hidden_size * (2 if self.norm_has_bias else 1)
            if not (self.tie_word_embeddings and pp == 1):
                params += self.lm_head_params(tp)
        return params

    # --- the engine's view -------------------------------------------------------------------------------
    def engine_hf_config(self) -> dict[str, Any]:
        """A Llama-type HF config with this model's vocabulary, context, widths, heads and layers.

        Enough for the engine (``load_format="dummy"``) to build its scheduler and block manager: the KV
        block size and vocabulary match the real model. The layers themselves are Llama's (a gated SiLU MLP
        of ``intermediate_size``, no sliding window), which the simulator never runs.
        """
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }


def _first(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def available_models() -> list[str]:
    """Short names of the shipped specs."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def activation_reserve_bytes(spec: ModelSpec, tp: int, num_tokens: int = 2048, dtype_bytes: int = 2) -> int:
    """Peak activation bytes of a forward pass over ``num_tokens`` on one TP rank, as a memory profile run
    sees them: the residual stream and norm output, the fused QKV and attention output, the MLP's
    up-projection (and its activation), and fp32 logits for ``PROFILE_NUM_SEQS`` sampled sequences."""
    q = spec.heads_per_gpu(tp) * spec.head_dim
    kv = spec.kv_heads_per_gpu(tp) * spec.head_dim
    up = (2 if spec.gated_mlp else 1) * spec.intermediate_per_gpu(tp)
    per_token = 3 * spec.hidden_size + (2 * q + 2 * kv) + up + spec.intermediate_per_gpu(tp)
    logits = PROFILE_NUM_SEQS * spec.vocab_per_gpu(tp) * 4
    return num_tokens * per_token * dtype_bytes + logits


def kv_cache_blocks(
    spec: ModelSpec,
    hardware: Hardware,
    tp: int,
    pp: int,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    dtype_bytes: int = 2,
    activation_tokens: int = 2048,
) -> int:
    """KV blocks of ``block_size`` tokens per GPU, sized as vLLM does: ``gpu_memory_utilization`` of the
    GPU's memory, less its shard of the weights, the peak activations of ``activation_tokens`` and the
    runtime's own reserve, divided by what a block costs over the stage's layers. The pool is the same on
    every GPU of a replica, so the tightest stage sets it; 0 when the weights leave no room."""
    if tp < 1 or pp < 1:
        raise ValueError(f"tp and pp must be >= 1, got tp={tp}, pp={pp}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    budget = hardware.gpu.memory_bytes * gpu_memory_utilization
    reserve = RUNTIME_RESERVE_BYTES + activation_reserve_bytes(spec, tp, activation_tokens, dtype_bytes)
    per_token_layer = spec.kv_bytes_per_token(tp, dtype_bytes)
    blocks = []
    for stage, layers in enumerate(spec.layers_per_stage(pp)):
        free = budget - spec.stage_weight_params(tp, pp, stage) * dtype_bytes - reserve
        blocks.append(math.floor(free / (block_size * per_token_layer * layers)))
    return max(0, min(blocks))
