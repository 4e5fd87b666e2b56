"""Model half of sarathi: Llama-family models over a paged KV cache, loaders, and the embedded SmolLM2."""

from sarathi.model.attention import (
    AttentionMetadata,
    DecodeAttention,
    PrefillAttention,
    SeqSlice,
    build_attention_metadata,
)
from sarathi.model.config import ModelArchConfig, RopeScaling
from sarathi.model.embedded import embedded_model_path
from sarathi.model.kv_cache import allocate_kv_cache, kv_cache_bytes_per_block
from sarathi.model.llama import LlamaForCausalLM
from sarathi.model.loader import load_model
from sarathi.model.parallel import (
    ParallelContext,
    ShardSpec,
    TensorParallelGroup,
    init_distributed,
    threads_per_rank,
)

__all__ = [
    "AttentionMetadata",
    "DecodeAttention",
    "LlamaForCausalLM",
    "ModelArchConfig",
    "ParallelContext",
    "PrefillAttention",
    "RopeScaling",
    "SeqSlice",
    "ShardSpec",
    "TensorParallelGroup",
    "allocate_kv_cache",
    "build_attention_metadata",
    "embedded_model_path",
    "init_distributed",
    "kv_cache_bytes_per_block",
    "load_model",
    "threads_per_rank",
]
