"""The Llama-family decoder (Llama, Qwen2, Mistral without sliding window) over a paged KV cache.

Works on a flattened batch: T tokens from any mix of prefill chunks and decodes, no padding between them.
q/k/v and gate/up projections are fused into one matmul each (fewer, larger calls: per-call overhead
dominates for a narrow model at small batch on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sarathi.model.attention import AttentionMetadata
from sarathi.model.config import ModelArchConfig
from sarathi.model.linear import Linear
from sarathi.model.paged_attention import CacheReadPlan, GatherWorkspace, paged_attention, plan_cache_reads
from sarathi.model.rope import apply_rope, rope_cos_sin, rope_inv_freq

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Dtypes:
    """Storage dtype of weights and KV cache, and the dtype matmuls compute in."""

    storage: torch.dtype
    compute: torch.dtype

    def __post_init__(self) -> None:
        if self.storage != self.compute and (self.storage, self.compute) != (torch.bfloat16, torch.float32):
            raise ValueError(
                f"unsupported dtype {self.storage} with compute dtype {self.compute}: use the same dtype, "
                "or bfloat16 weights with float32 compute"
            )

    def linear(self, device: torch.device | str) -> tuple[torch.dtype, torch.device | str, torch.dtype]:
        """The (dtype, device, compute_dtype) arguments of a `Linear` built with these dtypes."""
        return self.storage, device, self.compute


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (weight kept in float32), returned in `out_dtype`."""

    def __init__(self, dim: int, eps: float, out_dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps, self.out_dtype = eps, out_dtype
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last dimension of x (float32, the residual stream)."""
        return F.rms_norm(x.float(), self.weight.shape, self.weight, self.eps).to(self.out_dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE; reads and writes the paged KV cache."""

    def __init__(self, arch: ModelArchConfig, dtypes: Dtypes, device: torch.device | str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_attention_heads,
            arch.num_key_value_heads,
            arch.head_dim,
        )
        self.scale = self.head_dim**-0.5
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = Linear(arch.hidden_size, qkv_out, arch.attention_bias, *dtypes.linear(device))
        attn_width = self.num_heads * self.head_dim
        self.o_proj = Linear(attn_width, arch.hidden_size, arch.o_proj_bias, *dtypes.linear(device))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        plan: CacheReadPlan,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        h, kvh = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(x.shape[0], h + 2 * kvh, self.head_dim)
        qk = apply_rope(qkv[:, : h + kvh], cos, sin)
        out = paged_attention(qk[:, :h], qk[:, h:], qkv[:, h + kvh :], kv[0], kv[1], meta, plan, self.scale)
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, arch: ModelArchConfig, dtypes: Dtypes, device: torch.device | str) -> None:
        super().__init__()
        width, hidden = arch.intermediate_size, arch.hidden_size
        self.gate_up_proj = Linear(hidden, 2 * width, arch.mlp_bias, *dtypes.linear(device))
        self.down_proj = Linear(width, hidden, arch.mlp_bias, *dtypes.linear(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual connection."""

    def __init__(self, arch: ModelArchConfig, dtypes: Dtypes, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtypes.compute, device)
        self.self_attn = Attention(arch, dtypes, device)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtypes.compute, device)
        self.mlp = MLP(arch, dtypes, device)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        plan: CacheReadPlan,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """h [T, hidden] float32 -> [T, hidden] float32."""
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, meta, plan, kv)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    """Decoder stack + LM head. Parameters start uninitialized: load them with `load_hf_weights`.

    `dtype` is what the weights (and the KV cache the engine allocates, `self.dtype`) are stored in;
    `compute_dtype` what the matmuls read and write: float32 (default) or, with bf16 weights, bfloat16.
    """

    def __init__(
        self,
        arch: ModelArchConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        dtypes = Dtypes(dtype, compute_dtype)
        self.arch, self.dtype, self.compute_dtype = arch, dtype, compute_dtype
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size, dtype=dtype, device=device)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(arch, dtypes, device) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, compute_dtype, device)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, False, *dtypes.linear(device))
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        inv_freq = rope_inv_freq(arch.head_dim, arch.rope_theta, arch.rope_scaling)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        self._workspace = GatherWorkspace()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        kv_caches: KVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run T flattened tokens, writing their K/V into `kv_caches`; float32 logits [K, vocab] for the
        rows in `logits_indices` (only those go through the final norm and the LM head)."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} kv cache layers, got {len(kv_caches)}")
        # The residual stream stays float32 in every model dtype: in bf16 this cuts SmolLM2's (30 layers)
        # relative logits error vs fp32 from 2.1e-2 to 1.2e-2, for elementwise adds on [T, hidden].
        h = self.embed_tokens(input_ids).float()
        cos, sin = rope_cos_sin(positions, self.inv_freq)
        plan = plan_cache_reads(metadata, kv_caches[0][0], self._workspace, self.compute_dtype)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, metadata, plan, kv)
        h = self.norm(h.index_select(0, logits_indices))
        return self.lm_head(h).float()

    def hf_weight_sources(self) -> dict[str, list[str]]:
        """For each parameter to load: the HF checkpoint tensors concatenated (dim 0) to form it."""
        arch = self.arch
        sources: dict[str, list[str]] = {
            "embed_tokens.weight": ["model.embed_tokens.weight"],
            "norm.weight": ["model.norm.weight"],
        }
        if not arch.tie_word_embeddings:
            sources["lm_head.weight"] = ["lm_head.weight"]
        for i in range(arch.num_hidden_layers):
            ours, hf = f"layers.{i}.", f"model.layers.{i}."
            fused = {
                "self_attn.qkv_proj": [f"{hf}self_attn.{p}_proj" for p in "qkv"],
                "self_attn.o_proj": [f"{hf}self_attn.o_proj"],
                "mlp.gate_up_proj": [f"{hf}mlp.gate_proj", f"{hf}mlp.up_proj"],
                "mlp.down_proj": [f"{hf}mlp.down_proj"],
            }
            for name, parts in fused.items():
                sources[f"{ours}{name}.weight"] = [f"{p}.weight" for p in parts]
            biases = {
                "self_attn.qkv_proj": arch.attention_bias,
                "self_attn.o_proj": arch.o_proj_bias,
                "mlp.gate_up_proj": arch.mlp_bias,
                "mlp.down_proj": arch.mlp_bias,
            }
            for name, has_bias in biases.items():
                if has_bias:
                    sources[f"{ours}{name}.bias"] = [f"{p}.bias" for p in fused[name]]
            for norm in ("input_layernorm", "post_attention_layernorm"):
                sources[f"{ours}{norm}.weight"] = [f"{hf}{norm}.weight"]
        return sources

    @torch.no_grad()
    def load_hf_weights(self, fetch: Callable[[str], torch.Tensor]) -> None:
        """Fill every parameter from HF tensors; `fetch(name)` returns one (any dtype) or raises KeyError."""
        params = dict(self.named_parameters())
        for name, parts in self.hf_weight_sources().items():
            param = params[name]
            tensor = torch.cat([fetch(p) for p in parts]) if len(parts) > 1 else fetch(parts[0])
            if tensor.shape != param.shape:
                raise ValueError(
                    f"tensor {' + '.join(parts)} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(param.shape)}"
                )
            param.copy_(tensor)

    def pack_weights(self) -> None:
        """Switch every linear layer to pre-packed oneDNN weights where supported (irreversible)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
