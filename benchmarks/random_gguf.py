"""GGUF files of random weights at the shapes CPU users serve (Llama 3.2 1B and 3B), for benchmarks: no hub
download exists here, and speed does not depend on the values.

The weights are N(0, 0.02) float16 (llama.cpp's `llama-quantize` makes BF16 / Q8_0 / Q4_K_M files from this
one). The tokenizer is the embedded SmolLM2's byte-level BPE, with reserved control tokens appended up to the
shape's vocabulary, so both engines load the file as a normal chat-less model.

    python -m benchmarks.random_gguf 1b   # writes (once) and prints the path
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from sarathi.model.embedded import cache_root, embedded_gguf_path


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-family architecture's sizes."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 500000.0


SHAPES = {
    "1b": LlamaShape(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
    "3b": LlamaShape(hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, vocab=128256),
}


def random_gguf_path(name: str) -> Path:
    """Where the F16 file of shape `name` lives (written by `ensure_random_gguf`)."""
    return cache_root() / "random-gguf" / f"random-llama-{name}.F16.gguf"


def _copy_tokenizer(writer: gguf.GGUFWriter, vocab: int) -> None:
    src = gguf.GGUFReader(str(embedded_gguf_path()))

    def field(key: str):
        return src.get_field(key).contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    extra = vocab - len(tokens)
    tokens += [f"<|reserved_special_token_{i}|>" for i in range(extra)]
    types += [gguf.TokenType.CONTROL] * extra
    writer.add_tokenizer_model(field("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(field("tokenizer.ggml.merges")))
    writer.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    writer.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    writer.add_add_bos_token(False)


def write_random_gguf(path: Path, shape: LlamaShape, seed: int = 0) -> None:
    """Write a float16 Llama GGUF of `shape` with N(0, 0.02) weights and unit norms (tied LM head)."""
    rng = np.random.default_rng(seed)
    head_dim = shape.hidden // shape.heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random llama {path.stem}")
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _copy_tokenizer(writer, shape.vocab)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(shape.hidden, dtype=np.float32)
    q_rows, kv_rows = shape.heads * head_dim, shape.kv_heads * head_dim
    writer.add_tensor("token_embd.weight", matrix(shape.vocab, shape.hidden))
    writer.add_tensor("output_norm.weight", ones)
    for i in range(shape.layers):
        blk = f"blk.{i}."
        writer.add_tensor(blk + "attn_norm.weight", ones)
        writer.add_tensor(blk + "attn_q.weight", matrix(q_rows, shape.hidden))
        writer.add_tensor(blk + "attn_k.weight", matrix(kv_rows, shape.hidden))
        writer.add_tensor(blk + "attn_v.weight", matrix(kv_rows, shape.hidden))
        writer.add_tensor(blk + "attn_output.weight", matrix(shape.hidden, q_rows))
        writer.add_tensor(blk + "ffn_norm.weight", ones)
        writer.add_tensor(blk + "ffn_gate.weight", matrix(shape.intermediate, shape.hidden))
        writer.add_tensor(blk + "ffn_up.weight", matrix(shape.intermediate, shape.hidden))
        writer.add_tensor(blk + "ffn_down.weight", matrix(shape.hidden, shape.intermediate))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def ensure_random_gguf(name: str) -> Path:
    """The F16 random GGUF of shape `name` (a SHAPES key), written once."""
    path = random_gguf_path(name)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write_random_gguf(tmp, SHAPES[name])
        tmp.rename(path)
    return path


if __name__ == "__main__":
    print(ensure_random_gguf(sys.argv[1] if len(sys.argv) > 1 else "1b"))
