"""Reading llama.cpp GGUF files: metadata -> HF config dict, tensors -> dequantized HF-named tensors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from sarathi.model.config import ModelArchConfig
from sarathi.model.gguf_header import GGUFHeader, LongArray
from sarathi.model.quantized import FORMATS, QuantizedTensor
from sarathi.model.safetensors_folder import MissingTensorError
from sarathi.model.weight_parts import TensorPart

_SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
_MODEL_TYPES = {"gemma3": "gemma3_text"}  # GGUF architecture -> HF model_type, where they differ
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# Gemma's four norms per layer: llama.cpp's ffn_norm is the one before the MLP there
_GEMMA_LAYER_TENSORS = {
    **_LAYER_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """HF checkpoint name for a llama.cpp tensor name (e.g. blk.3.attn_q.weight); None if it has none."""
    m = _LAYER_NAME.fullmatch(gguf_name)
    if m:
        layer, kind, suffix = m.groups()
        hf = (_GEMMA_LAYER_TENSORS if architecture == "gemma3" else _LAYER_TENSORS).get(kind)
        return f"model.layers.{layer}.{hf}.{suffix}" if hf else None
    base, _, suffix = gguf_name.rpartition(".")
    hf = _GLOBAL_TENSORS.get(base)
    return f"{hf}.{suffix}" if hf and suffix in ("weight", "bias") else None


def unpermute_rotary_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of q/k projection rows (weight [rows, cols] or bias [rows]).

    Within each head of `head_dim` rows, HF keeps the two rotary halves as blocks: row half * head_dim/2 + i.
    llama.cpp's converter interleaves them into pairs: row 2 * i + half. Reading the GGUF rows as
    (head, i, half) and swapping the last two axes restores (head, half, i).
    """
    half_dim = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half_dim, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _field(header: GGUFHeader, key: str, default: Any = None) -> Any:
    value = header.metadata.get(key)
    return default if value is None else value


def _float32_value(x: float) -> float:
    """GGUF stores float32: 1e-5 reads back as 9.99999974e-06; recover the shortest decimal it came from."""
    return float(str(np.float32(x)))


class GGUFCheckpoint:
    """A GGUF file viewed as an HF checkpoint: `hf_config` dict and `get(hf_name)` dequantized to float32."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        self.header = GGUFHeader(self.path)
        self.architecture = _field(self.header, "general.architecture")
        if self.architecture not in _SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported GGUF architecture {self.architecture!r} in {self.path} "
                f"(supported: {', '.join(_SUPPORTED_ARCHITECTURES)})"
            )
        self._tensors = {t.name: t for t in self.header.tensors}
        if "rope_freqs.weight" in self._tensors:
            raise ValueError(f"{self.path}: GGUF rope_freqs (per-frequency rope scaling) is not supported")
        self._by_hf_name = {
            hf: t for name, t in self._tensors.items() if (hf := hf_tensor_name(name, self.architecture))
        }
        self.hf_config = self._hf_config()

    def _hf_config(self) -> dict[str, Any]:
        arch, r = self.architecture, self.header
        heads = int(_field(r, f"{arch}.attention.head_count"))
        hidden = int(_field(r, f"{arch}.embedding_length"))
        tokens = _field(r, "tokenizer.ggml.tokens")
        vocab = _field(r, f"{arch}.vocab_size") or (
            tokens.length if isinstance(tokens, LongArray) else len(tokens)
        )
        d: dict[str, Any] = {
            "model_type": _MODEL_TYPES.get(arch, arch),
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(_field(r, f"{arch}.feed_forward_length")),
            "num_hidden_layers": int(_field(r, f"{arch}.block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(_field(r, f"{arch}.attention.head_count_kv", heads)),
            "head_dim": int(_field(r, f"{arch}.attention.key_length", hidden // heads)),
            "rms_norm_eps": _float32_value(_field(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": _float32_value(_field(r, f"{arch}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(_field(r, f"{arch}.context_length", 2048)),
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "bos_token_id": _field(r, "tokenizer.ggml.bos_token_id"),
            "eos_token_id": _field(r, "tokenizer.ggml.eos_token_id"),
        }
        scaling = _field(r, f"{arch}.rope.scaling.type")
        if scaling and scaling != "none":
            d["rope_scaling"] = {"rope_type": scaling, "factor": _field(r, f"{arch}.rope.scaling.factor")}
        window = _field(r, f"{arch}.attention.sliding_window")
        if arch == "gemma3":
            # What llama.cpp assumes for Gemma 3 files, which do not record them: sliding layers rotate with
            # base 10000, five of every six layers slide, and queries are scaled by head_dim ** -0.5.
            d.update(sliding_window=window, rope_local_base_freq=10000.0, query_pre_attn_scalar=d["head_dim"])
        elif window:
            d.update(sliding_window=int(window), use_sliding_window=True)
        return d

    @property
    def arch(self) -> ModelArchConfig:
        """The architecture described by the file's metadata."""
        return ModelArchConfig.from_hf_config(self.hf_config)

    def names(self) -> list[str]:
        """HF names of all mapped tensors."""
        return list(self._by_hf_name)

    def get(self, hf_name: str) -> torch.Tensor:
        """Dequantized float32 tensor in HF layout (q/k rows un-permuted for llama)."""
        t = self._by_hf_name.get(hf_name)
        if t is None:
            raise MissingTensorError(f"tensor {hf_name!r} not found in {self.path}")
        values = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32, copy=True)
        tensor = torch.from_numpy(values).reshape([int(n) for n in reversed(t.shape)])
        if self.architecture == "gemma3" and hf_name.endswith("norm.weight"):
            tensor -= 1  # llama.cpp stores Gemma's RMSNorm scales as 1 + weight; HF keeps the weight
        if self.architecture == "llama":
            if ".self_attn.q_proj." in hf_name:
                tensor = unpermute_rotary_rows(tensor, self.hf_config["num_attention_heads"])
            elif ".self_attn.k_proj." in hf_name:
                tensor = unpermute_rotary_rows(tensor, self.hf_config["num_key_value_heads"])
        return tensor

    def quantized(self, part: TensorPart) -> QuantizedTensor | None:
        """The part as the file's quantized blocks (HF row order), or None where its type has no quantized
        kernel (F32, F16, ...) or the part cuts through blocks: those are dequantized instead."""
        t = self._by_hf_name.get(part.name)
        if t is None:
            raise MissingTensorError(f"tensor {part.name!r} not found in {self.path}")
        if t.tensor_type.name not in FORMATS or len(t.shape) != 2:
            return None
        rows, cols = int(t.shape[1]), int(t.shape[0])
        part.check_shape((rows, cols))
        blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True).reshape(rows, -1))
        q = QuantizedTensor(t.tensor_type.name, rows, cols, blocks)
        if self.architecture == "llama":
            heads = {".self_attn.q_proj.": "num_attention_heads", ".self_attn.k_proj.": "num_key_value_heads"}
            for key, count in heads.items():
                if key in part.name:
                    q = q.permute_rows(unpermute_rotary_rows(torch.arange(rows), self.hf_config[count]))
        if part.dim is None:
            return q
        return q.row_slice(part.start, part.end) if part.dim == 0 else q.col_slice(part.start, part.end)

    def fetch(self, part: TensorPart) -> torch.Tensor:
        """One part of a tensor. GGUF blocks are quantized (and q/k rows permuted) over whole rows, so this
        dequantizes the whole tensor, then slices it: sharded ranks should rather load a safetensors folder
        (the embedded model is normally read from one converted from its GGUF)."""
        return part.take(self.get(part.name))
