"""The decoder of every supported family (Llama, Qwen2, Qwen3, Mistral, Gemma 3 text) over a paged KV cache.

One file generalised rather than one per family: they share the block structure and the paged attention, and
differ by a few switches of `ModelArchConfig` (QK-norm, Gemma's four norms and GELU-tanh MLP, scaled
embeddings, sliding-window layers with their own RoPE base), each a line or two here.

Works on a flattened batch: T tokens from any mix of prefill chunks and decodes, no padding between them.
q/k/v and gate/up projections are fused into one matmul each (fewer, larger calls: per-call overhead
dominates for a narrow model at small batch on CPU).

Sharding (`ShardSpec`): a pipeline stage holds a contiguous run of layers; within a stage, tensor parallelism
splits attention by whole kv-head groups and the MLP by intermediate columns (Megatron-style: column-parallel
qkv and gate/up, row-parallel o and down followed by a float32 all-reduce).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sarathi.core.kv_groups import layer_slots
from sarathi.model import decode_run, kernels, llama_weights
from sarathi.model.attention import AttentionMetadata
from sarathi.model.config import ModelArchConfig
from sarathi.model.embedding import TokenEmbedding
from sarathi.model.linear import Linear
from sarathi.model.paged_attention import CacheReadPlan, GatherWorkspace, paged_attention, plan_cache_reads
from sarathi.model.parallel import WHOLE_MODEL, ShardSpec, TensorParallelGroup
from sarathi.model.rope import apply_rope, rope_cos_sin, rope_inv_freq
from sarathi.model.weight_parts import Fetch, QuantizedFetch

KVCache = list[tuple[torch.Tensor, torch.Tensor]]
# Attention computes in float32 at every model dtype, over K/V read as the cache stores them. With bf16 math,
# rounding the queries and probabilities to bf16 as well raised SmolLM2's logits error from 1.13x to 1.35x
# the floor of "bf16 GEMM inputs + bf16 KV cache"; in float32 it costs nothing at prefill (SDPA) and decodes
# run our kernel, which reads the bf16 cache in place.
ATTENTION_DTYPE = torch.float32


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

    def fused(self, device: torch.device | str) -> bool:
        """Whether a layer runs its elementwise steps, RoPE and the cache write through our fused kernels:
        bf16 math where the AVX-512 kernels run, float32 math on CPUs with only their AVX2 builds (there
        float32 is the path served; on AVX-512 CPUs float32 keeps PyTorch's exact ops)."""
        if torch.device(device).type != "cpu":
            return False
        if self.compute == torch.bfloat16:
            return kernels.available()
        avx2_only = not kernels.available() and kernels.portable_available()
        return self.compute == torch.float32 and avx2_only


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (weight kept in float32), returned in `out_dtype`."""

    def __init__(self, dim: int, eps: float, out_dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps, self.out_dtype = eps, out_dtype
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last dimension of x (float32, the residual stream)."""
        return self.rows(x, None)

    def rows(self, x: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
        """Normalize rows `indices` of x [T, dim] (all of x, any leading shape, when None): our kernel
        selects, normalizes and rounds in one call where it runs."""
        cpu_rows = x.dtype == torch.float32 and x.is_cpu and x.is_contiguous()
        if cpu_rows and self.out_dtype in (torch.float32, torch.bfloat16) and kernels.portable_available():
            return kernels.rms_norm_f32(x, self.weight, self.eps, indices, self.out_dtype == torch.bfloat16)
        if indices is not None:
            x = x.index_select(0, indices)
        return F.rms_norm(x.float(), self.weight.shape, self.weight, self.eps).to(self.out_dtype)


def _row_parallel_output(y: torch.Tensor, tp: TensorParallelGroup) -> torch.Tensor:
    """Sum a row-parallel layer's partial outputs over the TP ranks, in float32."""
    return y if tp.size == 1 else tp.all_reduce(y.float())


@dataclass(frozen=True)
class LayerInputs:
    """What attention of one kind (global or sliding window) reads in a forward: rotation tables, the batch's
    metadata and cache-read plan."""

    cos: torch.Tensor
    sin: torch.Tensor
    meta: AttentionMetadata
    plan: CacheReadPlan


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE over this TP rank's kv-head groups; reads and writes the paged
    KV cache (which holds only those kv heads). With QK-norm, each q and k head is RMS-normalized first."""

    def __init__(
        self,
        arch: ModelArchConfig,
        dtypes: Dtypes,
        device: torch.device | str,
        shard: ShardSpec,
        tp: TensorParallelGroup,
    ) -> None:
        super().__init__()
        q_start, q_end = shard.q_head_range(arch.num_attention_heads, arch.num_key_value_heads)
        kv_start, kv_end = shard.kv_head_range(arch.num_key_value_heads)
        self.num_heads, self.num_kv_heads, self.head_dim = q_end - q_start, kv_end - kv_start, arch.head_dim
        self.scale = arch.attention_scale if arch.attention_scale is not None else self.head_dim**-0.5
        self.tp, self.fused, self.eps = tp, dtypes.fused(device), arch.rms_norm_eps
        # (cache dtype, whether RoPE and the cache write run in our kernel for it), set on the first call
        self._rope_fused: tuple[torch.dtype, bool] | None = None
        self.q_norm = self.k_norm = None
        if arch.qk_norm:
            self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps, torch.float32, device)
            self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps, torch.float32, device)
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = Linear(arch.hidden_size, qkv_out, arch.attention_bias, *dtypes.linear(device))
        attn_width = self.num_heads * self.head_dim
        o_bias = arch.o_proj_bias and shard.tp_rank == 0  # added once to the sum over TP ranks
        self.o_proj = Linear(attn_width, arch.hidden_size, o_bias, *dtypes.linear(device))

    def forward(
        self, x: torch.Tensor, inputs: LayerInputs, kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        h, kvh = self.num_heads, self.num_kv_heads
        cos, sin, meta, plan = inputs.cos, inputs.sin, inputs.meta, inputs.plan
        qkv = self.qkv_proj(x).view(x.shape[0], h + 2 * kvh, self.head_dim)
        if self._rope_fused is None or self._rope_fused[0] != kv[0].dtype:  # once per cache dtype
            serves = self.fused and kernels.rope_kernel_serves(self.head_dim, kv[0])
            self._rope_fused = (kv[0].dtype, serves)
        if self._rope_fused[1] and qkv.dtype == torch.float32:
            # only a prefill chunk starting at 0 attends to its own k, v rather than the cache
            own_kv = any(rows is None for rows in plan.prefill_rows)
            norms = None if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight, self.eps)
            q, k, v = kernels.rope_write_kv(qkv, cos, sin, kv[0], kv[1], meta.slot_mapping, h, own_kv, norms)
            out = paged_attention(q, k, v, kv[0], kv[1], meta, plan, self.scale, written=True)
            return _row_parallel_output(self.o_proj(out), self.tp)
        if self.q_norm is not None:
            q, k = self.q_norm(qkv[:, :h]), self.k_norm(qkv[:, h : h + kvh])
            q, k = apply_rope(q, cos, sin, ATTENTION_DTYPE), apply_rope(k, cos, sin, ATTENTION_DTYPE)
            v = qkv[:, h + kvh :].to(ATTENTION_DTYPE)
            out = paged_attention(q, k, v, kv[0], kv[1], meta, plan, self.scale)
            return _row_parallel_output(self.o_proj(out), self.tp)
        qk = apply_rope(qkv[:, : h + kvh], cos, sin, ATTENTION_DTYPE)
        v = qkv[:, h + kvh :].to(ATTENTION_DTYPE)
        out = paged_attention(qk[:, :h], qk[:, h:], v, kv[0], kv[1], meta, plan, self.scale)
        return _row_parallel_output(self.o_proj(out), self.tp)


class MLP(nn.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)) with SiLU (SwiGLU) or GELU-tanh (Gemma), over this TP
    rank's intermediate columns (the product is taken in gate/up's output dtype, float32 from the bf16
    kernel, and down rounds it to bf16)."""

    def __init__(
        self,
        arch: ModelArchConfig,
        dtypes: Dtypes,
        device: torch.device | str,
        shard: ShardSpec,
        tp: TensorParallelGroup,
    ) -> None:
        super().__init__()
        start, end = shard.column_range(arch.intermediate_size)
        width, hidden = end - start, arch.hidden_size
        self.tp, self.gelu = tp, arch.hidden_act == "gelu_pytorch_tanh"
        self.fused, self.act_dtype = dtypes.fused(device), dtypes.compute
        self.gate_up_proj = Linear(hidden, 2 * width, arch.mlp_bias, *dtypes.linear(device))
        down_bias = arch.mlp_bias and shard.tp_rank == 0  # added once to the sum over TP ranks
        self.down_proj = Linear(width, hidden, down_bias, *dtypes.linear(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        gate_up = self.gate_up_proj(x)
        if self.fused and gate_up.dtype == torch.float32:
            act_mul = kernels.gelu_mul if self.gelu else kernels.silu_mul
            return _row_parallel_output(self.down_proj(act_mul(gate_up, self.act_dtype)), self.tp)
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return _row_parallel_output(self.down_proj(act * up), self.tp)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual connection (Gemma: each output
    normalized again before it is added, "sandwich" norms)."""

    def __init__(
        self,
        arch: ModelArchConfig,
        dtypes: Dtypes,
        device: torch.device | str,
        shard: ShardSpec,
        tp: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtypes.compute, device)
        self.self_attn = Attention(arch, dtypes, device, shard, tp)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtypes.compute, device)
        self.mlp = MLP(arch, dtypes, device, shard, tp)
        self.sandwich = arch.sandwich_norms
        if self.sandwich:  # post_attention_layernorm then normalizes attention's output (float32, to add)
            self.post_attention_layernorm.out_dtype = torch.float32
            self.pre_feedforward_layernorm = RMSNorm(
                arch.hidden_size, arch.rms_norm_eps, dtypes.compute, device
            )
            self.post_feedforward_layernorm = RMSNorm(
                arch.hidden_size, arch.rms_norm_eps, torch.float32, device
            )
        self.fused, self.eps, self.act_dtype = dtypes.fused(device), arch.rms_norm_eps, dtypes.compute
        # (cache dtype, the weights `decode_layers` runs this layer with, or None), set on first use
        self._decode_kernel: tuple[torch.dtype, decode_run.DecodeLayerWeights | None] | None = None

    def forward(
        self, h: torch.Tensor, inputs: LayerInputs, kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """h [T, hidden] float32 -> [T, hidden] float32 (fused: updated in place and returned). A batch of
        decodes only is run by `LlamaForCausalLM` through `decode_run.decode_layers` where this layer composes
        (`decode_layer_weights`): the same kernels in one call."""
        if self.fused and self.sandwich:  # each output normalized, added and the sum normalized: one pass
            act = self.act_dtype
            x = kernels.add_rms_norm(h, None, self.input_layernorm.weight, self.eps, act)
            attn = self.self_attn(x, inputs, kv)
            post, pre = self.post_attention_layernorm.weight, self.pre_feedforward_layernorm.weight
            x = kernels.norm_add_rms_norm(h, attn, post, pre, self.eps, act)
            last = self.post_feedforward_layernorm.weight
            kernels.norm_add_rms_norm(h, self.mlp(x), last, None, self.eps, act)
            return h
        if self.fused:  # the residual adds happen in place, inside the norms' single pass
            x = kernels.add_rms_norm(h, None, self.input_layernorm.weight, self.eps, self.act_dtype)
            attn = self.self_attn(x, inputs, kv)
            x = kernels.add_rms_norm(h, attn, self.post_attention_layernorm.weight, self.eps, self.act_dtype)
            return h.add_(self.mlp(x))
        if self.sandwich:
            h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), inputs, kv))
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        h = h + self.self_attn(self.input_layernorm(h), inputs, kv)
        return h + self.mlp(self.post_attention_layernorm(h))

    def decode_layer_weights(self, k_cache: torch.Tensor) -> decode_run.DecodeLayerWeights | None:
        """What `decode_run.decode_layers` runs this layer with, or None where it does not compose this layer:
        a linear not quantized or with a bias, more than one TP rank, or the RoPE kernel not serving this
        cache. Decided once per cache dtype."""
        if self._decode_kernel is None or self._decode_kernel[0] != k_cache.dtype:
            attn, mlp = self.self_attn, self.mlp
            linears = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
            serves = (
                attn.tp.size == 1
                and all(lin.quantized_segments and lin.bias is None for lin in linears)
                and kernels.rope_kernel_serves(attn.head_dim, k_cache)
            )
            weights = None
            if serves:
                norms = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
                if attn.q_norm is not None:
                    norms += [attn.q_norm.weight, attn.k_norm.weight]
                if self.sandwich:
                    norms += [self.pre_feedforward_layernorm.weight, self.post_feedforward_layernorm.weight]
                tensors, segments = decode_run.DecodeLayerWeights.segments_of(
                    [lin.quantized_segments for lin in linears]
                )
                weights = decode_run.DecodeLayerWeights(
                    norms,
                    tensors,
                    segments,
                    [lin.out_features for lin in linears],
                    attn.num_heads,
                    attn.head_dim,
                    self.eps,
                    mlp.gelu,
                    attn.q_norm is not None,
                    self.sandwich,
                    self.act_dtype == torch.float32,
                )
            self._decode_kernel = (k_cache.dtype, weights)
        return self._decode_kernel[1]


class LlamaForCausalLM(nn.Module):
    """Decoder stack + LM head, or one shard of it. Parameters start uninitialized: load them with
    `load_hf_weights`.

    `dtype` is what the weights (and the KV cache the engine allocates, `self.dtype`) are stored in;
    `compute_dtype` what the matmuls read and write: float32 (default) or, with bf16 weights, bfloat16.

    `shard` picks the part this process holds: the layers of its pipeline stage (`self.layers` holds only
    those; `self.first_layer` is the HF index of the first) and its TP slice of each of them. The embedding
    (first stage) and the final norm and LM head (last stage) are replicated on every TP rank of their stage,
    not split: they are a small part of the work, and replicas need no all-gather of logits. `tp_group` sums
    the row-parallel outputs across the stage's TP ranks; None is fine when tp_size is 1.
    """

    def __init__(
        self,
        arch: ModelArchConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        compute_dtype: torch.dtype = torch.float32,
        shard: ShardSpec = WHOLE_MODEL,
        tp_group: TensorParallelGroup | None = None,
    ) -> None:
        super().__init__()
        tp = tp_group if tp_group is not None else TensorParallelGroup(None, shard.tp_size)
        if tp.size != shard.tp_size:
            raise ValueError(f"tp_group has {tp.size} ranks, the shard spec {shard.tp_size}")
        dtypes = Dtypes(dtype, compute_dtype)
        self.arch, self.dtype, self.compute_dtype, self.shard = arch, dtype, compute_dtype, shard
        self.first_layer, end_layer = shard.layer_range(arch.num_hidden_layers)
        self.embed_tokens: TokenEmbedding | None = None
        if shard.is_first_stage:
            self.embed_tokens = TokenEmbedding(arch.vocab_size, arch.hidden_size, dtype, device)
        self.layers = nn.ModuleList(
            DecoderLayer(arch, dtypes, device, shard, tp) for _ in range(self.first_layer, end_layer)
        )
        self.kv_groups = arch.kv_cache_groups
        self.layer_group = layer_slots(self.kv_groups, self.first_layer, end_layer).group_of
        self.norm: RMSNorm | None = None
        self.lm_head: Linear | None = None
        if shard.is_last_stage:
            self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, compute_dtype, device)
            self.lm_head = Linear(arch.hidden_size, arch.vocab_size, False, *dtypes.linear(device))
            if arch.tie_word_embeddings and self.embed_tokens is not None:
                self.lm_head.weight = self.embed_tokens.weight
        inv_freq = rope_inv_freq(arch.head_dim, arch.rope_theta, arch.rope_scaling)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        local_theta = arch.local_rope_theta if arch.local_rope_theta is not None else arch.rope_theta
        local_inv_freq = (
            inv_freq if arch.local_rope_theta is None else rope_inv_freq(arch.head_dim, local_theta)
        )
        self.register_buffer("local_inv_freq", local_inv_freq.to(device), persistent=False)
        self._workspace = GatherWorkspace()
        self._decode_runs: dict[torch.dtype, list[tuple[int, int, decode_run.DecodeRun | None]]] = {}

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata | Sequence[AttentionMetadata],
        kv_caches: KVCache,
        logits_indices: torch.Tensor,
        hidden_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run T flattened tokens through this stage's layers, writing their K/V into `kv_caches`.

        The first stage reads `input_ids` (LongTensor[T]), later ones `hidden_states` (float32 [T, hidden],
        the previous stage's output). The last stage returns float32 logits [K, vocab] for the rows in
        `logits_indices` (only those go through the final norm and the LM head); other stages return the
        float32 hidden states [T, hidden], the same on every TP rank.

        `metadata` is one per KV-cache group (the engine's shared-page layout), or one for all layers when
        every layer has its own pools (`allocate_kv_cache` without `shared_pages`).
        """
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} kv cache layers, got {len(kv_caches)}")
        if self.embed_tokens is not None:
            # The residual stream stays float32 in every model dtype: in bf16 this cuts SmolLM2's (30 layers)
            # relative logits error vs fp32 from 2.1e-2 to 1.2e-2, for elementwise adds on [T, hidden].
            h = self.embed_tokens(input_ids)
            if self.arch.embedding_scale != 1.0:
                h = h * self.arch.embedding_scale
        elif hidden_states is None:
            raise ValueError(f"pipeline stage {self.shard.pp_rank} needs the previous stage's hidden_states")
        else:
            h = hidden_states.clone()  # layers may update the residual stream in place
        rotations: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}  # per kind: sliding or global
        inputs: dict[int, LayerInputs] = {}
        for g in dict.fromkeys(self.layer_group):
            window = self.kv_groups[g].window
            meta = metadata if isinstance(metadata, AttentionMetadata) else metadata[g]
            if window is not None:
                meta = meta.windowed(window)
            sliding = window is not None
            if sliding not in rotations:
                inv_freq = self.local_inv_freq if sliding else self.inv_freq
                rotations[sliding] = rope_cos_sin(positions, inv_freq)
            inputs[g] = self._layer_inputs(*rotations[sliding], meta, kv_caches)
        logits = None  # from the last run's call, where it holds the model's head
        for start, end, run in self._layer_runs(kv_caches[0][0]) if kv_caches else []:
            layer_inputs = inputs[self.layer_group[start]]
            plan = layer_inputs.plan
            if run is not None and not layer_inputs.meta.prefills and plan.decode_in_place:
                logits = decode_run.decode_layers(
                    h,
                    run,
                    layer_inputs.cos,
                    layer_inputs.sin,
                    [kv[0] for kv in kv_caches[start:end]],
                    [kv[1] for kv in kv_caches[start:end]],
                    layer_inputs.meta.slot_mapping,
                    plan.decode_tables,
                    plan.decode_lens,
                    plan.decode_window,
                    None if run.head is None else logits_indices,
                )
                continue
            for layer, kv in zip(self.layers[start:end], kv_caches[start:end], strict=True):
                h = layer(h, layer_inputs, kv)
        if self.lm_head is None:
            return h
        if logits is None:
            logits = self.lm_head(self.norm.rows(h, logits_indices))
            logits = logits if logits.dtype == torch.float32 else logits.float()
        cap = self.arch.final_logit_softcapping
        return logits if not cap else torch.tanh(logits / cap) * cap

    def _layer_runs(self, k_cache: torch.Tensor) -> list[tuple[int, int, decode_run.DecodeRun | None]]:
        """The layers as `decode_run.layer_runs` groups them (the last run with the model's head where the
        kernels compute it), decided once per cache dtype."""
        if k_cache.dtype not in self._decode_runs:
            head = decode_run.DecodeHead.of(self.norm, self.lm_head)
            self._decode_runs[k_cache.dtype] = decode_run.layer_runs(
                self.layers, self.layer_group, k_cache, head
            )
        return self._decode_runs[k_cache.dtype]

    def _layer_inputs(
        self, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata, kv_caches: KVCache
    ) -> LayerInputs:
        return LayerInputs(
            cos,
            sin,
            meta,
            plan_cache_reads(
                meta,
                kv_caches[0][0],
                self._workspace,
                ATTENTION_DTYPE,
                bf16_chunks=self.compute_dtype == torch.bfloat16,
            ),
        )

    def load_hf_weights(self, fetch: Fetch, quantized: QuantizedFetch | None = None) -> None:
        """Fill every parameter from parts of HF tensors (`llama_weights.load_hf_weights`)."""
        llama_weights.load_hf_weights(self, fetch, quantized)

    def quantize_linear_layers(self, qtype: str) -> None:
        """Quantize every linear layer's loaded weight to `qtype` blocks (`llama_weights`)."""
        llama_weights.quantize_linear_layers(self, qtype)

    def quantized_layers(self) -> dict[str, list[str]]:
        """Names of the linear layers kept quantized, by the formats they hold."""
        found: dict[str, list[str]] = {}
        for name, module in self.named_modules():
            if isinstance(module, Linear):
                for qtype in module.quantized_formats:
                    found.setdefault(qtype, []).append(name)
        return found

    def weight_bytes(self) -> int:
        """Resident bytes of every weight as held: quantized blocks, packed layouts or values, a tied table
        shared with the LM head counted once."""
        tables = [m for m in self.modules() if isinstance(m, (Linear, TokenEmbedding))]
        total = sum(m.weight_bytes for m in tables)
        tied = self.embed_tokens is not None and self.lm_head is not None
        if tied and self.embed_tokens.weight is not None and self.lm_head.weight is self.embed_tokens.weight:
            total -= self.embed_tokens.weight_bytes  # one Parameter behind both
        counted = {id(m.weight) for m in tables if m.weight is not None}
        return total + sum(p.numel() * p.element_size() for p in self.parameters() if id(p) not in counted)

    def pack_weights(self) -> None:
        """Switch every linear layer to pre-packed oneDNN weights where supported (irreversible)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
