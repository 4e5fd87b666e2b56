"""What `benchmarks/model_forward.py` (and kernel_ab, decode_states) run: the forward shapes and precisions,
one callable per case on our paged model and on transformers', and the GGUF file each precision runs on."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sarathi.model import SeqSlice, allocate_kv_cache, build_attention_metadata

BLOCK_SIZE = 16
CONTEXT = 512
PREFILL_TOKENS = (16, 64, 256)
DECODE_BATCHES = (1, 8, 32)
MIXED_CHUNK, MIXED_CHUNK_START, MIXED_DECODES = 64, 256, 16
# name -> (weights and KV cache, matmul arithmetic)
PRECISIONS = {
    "float32": (torch.float32, torch.float32),
    "bfloat16": (torch.bfloat16, torch.float32),
    "bf16-math": (torch.bfloat16, torch.bfloat16),
}
QUANTIZED = ("Q4_1", "Q8_0", "Q4_K_M")  # GGUF files of the embedded weights; Q4_1 is the one shipped
# more llama-quantize types, run on request: Q5_K_M (Q5_K, Q6_K), Q3_K_M (Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS
# (IQ4_XS, Q5_K, Q6_K), Q2_K (Q2_K, Q3_K, Q4_K, Q6_K); all served in their own code widths
# (sarathi/model/quantized.py)
MORE_QUANTIZED = ("Q5_K_M", "Q3_K_M", "IQ4_XS", "Q2_K")
DEFAULT_PRECISIONS = "float32,bfloat16,bf16-math,Q4_1"
GEMMA = "gemma3-270m"


def ours_prefill(model, arch, dtype, tokens: int) -> Callable[[], object]:
    """One prefill chunk of `tokens` tokens from position 0."""
    blocks = -(-tokens // BLOCK_SIZE)
    kv = allocate_kv_cache(arch, blocks, BLOCK_SIZE, dtype)
    meta = build_attention_metadata([SeqSlice(list(range(blocks)), 0, tokens)], BLOCK_SIZE)
    ids = torch.randint(0, arch.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    last = torch.tensor([tokens - 1])
    return lambda: model(ids, meta.positions, meta, kv, last)


def ours_decode(model, arch, dtype, batch: int) -> Callable[[], object]:
    """One decode step for `batch` sequences of CONTEXT cached tokens (blocks shuffled across sequences)."""
    per_seq = -(-(CONTEXT + 1) // BLOCK_SIZE)
    kv = allocate_kv_cache(arch, batch * per_seq, BLOCK_SIZE, dtype)
    pool = torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(0)).tolist()
    slices = [SeqSlice(pool[i * per_seq : (i + 1) * per_seq], CONTEXT, 1) for i in range(batch)]
    meta = build_attention_metadata(slices, BLOCK_SIZE)
    ids = torch.randint(0, arch.vocab_size, (batch,), generator=torch.Generator().manual_seed(0))
    rows = torch.arange(batch)
    return lambda: model(ids, meta.positions, meta, kv, rows)


def ours_mixed(model, arch, dtype) -> Callable[[], object]:
    """One stall-free iteration: a MIXED_CHUNK-token prefill chunk (MIXED_CHUNK_START tokens of its prompt
    already cached) with MIXED_DECODES decodes of CONTEXT cached tokens."""
    per_seq = -(-(CONTEXT + 1) // BLOCK_SIZE)
    chunk_blocks = -(-(MIXED_CHUNK_START + MIXED_CHUNK) // BLOCK_SIZE)
    total = MIXED_DECODES * per_seq + chunk_blocks
    kv = allocate_kv_cache(arch, total, BLOCK_SIZE, dtype)
    pool = torch.randperm(total, generator=torch.Generator().manual_seed(0)).tolist()
    slices = [SeqSlice(pool[:chunk_blocks], MIXED_CHUNK_START, MIXED_CHUNK)]
    rest = pool[chunk_blocks:]
    slices += [SeqSlice(rest[i * per_seq : (i + 1) * per_seq], CONTEXT, 1) for i in range(MIXED_DECODES)]
    meta = build_attention_metadata(slices, BLOCK_SIZE)
    tokens = MIXED_CHUNK + MIXED_DECODES
    ids = torch.randint(0, arch.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    rows = torch.tensor([MIXED_CHUNK - 1, *range(MIXED_CHUNK, tokens)])
    return lambda: model(ids, meta.positions, meta, kv, rows)


def hf_prefill(hf, arch, tokens: int) -> Callable[[], object]:
    """HF forward of `tokens` tokens without a cache, logits of the last token only."""
    ids = torch.randint(0, arch.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))

    def run():
        with torch.no_grad():
            return hf(ids, use_cache=False, logits_to_keep=1).logits

    return run


def hf_decode(hf, arch, dtype, batch: int) -> Callable[[], object]:
    """HF decode step for `batch` sequences over a DynamicCache of CONTEXT random tokens."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    gen = torch.Generator().manual_seed(0)
    shape = (batch, arch.num_key_value_heads, CONTEXT, arch.head_dim)
    for layer in range(arch.num_hidden_layers):
        keys, values = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
        cache.update(keys, values, layer)
    ids = torch.randint(0, arch.vocab_size, (batch, 1), generator=gen)
    positions = torch.full((batch, 1), CONTEXT)

    def run():
        with torch.no_grad():
            out = hf(ids, past_key_values=cache, position_ids=positions, logits_to_keep=1).logits
        cache.crop(-1)  # drop the token just appended
        return out

    return run


def source_gguf(model: str):
    """The GGUF the files of a --model are made from: the embedded Q4_1 file, Gemma 3's Q4_K_M file, or
    the random F16 one."""
    from benchmarks.random_gguf import ensure_random_gguf
    from sarathi.model.embedded import PACKAGED_MODELS, embedded_gguf_path

    if model == GEMMA:
        return PACKAGED_MODELS[GEMMA].gguf_path()
    return embedded_gguf_path() if model == "smollm2" else ensure_random_gguf(model)


def gguf_file(name: str, model: str = "smollm2"):
    """The GGUF file a precision runs on with llama.cpp: BF16 for bf16-math, else the named quantization
    (the source file itself where it is that quantization)."""
    from benchmarks.llama_cpp_build import ensure_gguf

    if (model, name) == (GEMMA, "Q4_K_M"):
        return source_gguf(model)
    return ensure_gguf("BF16" if name == "bf16-math" else name, src=source_gguf(model))


def quantized_file(name: str, model: str) -> str | None:
    """The file a quantized precision is served from: None (the embedded model) for SmolLM2's shipped Q4_1."""
    return None if (name, model) == ("Q4_1", "smollm2") else str(gguf_file(name, model))
