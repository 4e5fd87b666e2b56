"""Where a bf16 SmolLM2's logit error comes from: roundings simulated inside transformers' fp32 model.

Every row is the relative error norm ||logits - ref|| / ||ref|| over full prefills of a few prompts, against
two references: transformers in fp32 with the checkpoint's weights ("orig"), and with those weights rounded
to bf16 ("same weights": what a bf16 model actually holds). The simulated rows keep transformers' fp32 math
and round, with forward hooks, only the tensors named:

- weights: the weights alone (the gap between the two references);
- kv cache: keys after RoPE and v_proj outputs, as a bf16 KV cache stores them;
- linear inputs: every linear layer's input, as any bf16 GEMM reads it;
- linear inputs + outputs: also every linear layer's output, as PyTorch's CPU bf16 GEMMs write it (they have
  no bf16 x bf16 -> fp32 output; our AVX512-BF16 kernel does, and skips this rounding).

The last rows measure real implementations: ours with bf16 weights and KV cache and fp32 math (the
`bfloat16` dtype; it should sit on the "weights + kv cache" row), ours with bf16 math
(`compute_dtype=bfloat16`: bf16 GEMM inputs with fp32 accumulation and output, fp32 attention and residual
stream; its contract is <= 1.3x the "weights + linear inputs + kv cache" row), and transformers' own bf16
model. The quantized rows serve the weights exactly as the GGUF stores them (the "orig" reference is that
file dequantized, in fp32): simulated, with only the linear inputs and the KV cache rounded to bf16; and
measured, ours with `quantization="gguf"` (the file's Q4_1 / Q8_0 blocks, bf16 activations, fp32 sums). Its
contract: <= 1.5e-2 relative error vs orig.

The int8 rows simulate what the quantized kernels' int8 path (VPDPBUSD) does to every linear layer's input,
per 32 positions of a row: one int8 term, round(x / s) with s = max|x| / 127 (llama.cpp's Q8_0 activations),
or two, the second term the first's remainder at s / 256 (ours). "2 terms if max > r rms" keeps the
second term only in the blocks whose largest value stands r times above the block's RMS, the blocks an
outlier channel flattens: it asks whether a kernel could skip the second term's multiplies in the other
blocks. "1 term per 16 (8) positions" asks the same of smaller blocks, whose scales a kernel would apply
2 (4) times as often.

    python -m benchmarks.bf16_error_budget
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from benchmarks.record import save_result
from sarathi.model import (
    SeqSlice,
    allocate_kv_cache,
    build_attention_metadata,
    embedded_model_path,
    load_model,
)
from sarathi.model.bf16_rounding import bf16_roundings, round_weights_to_bf16

PROMPT_LEN = 100
TEXTS = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
    "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. "
    "Locally nicknamed 'La dame de fer', it was constructed as the centerpiece of the 1889 World's Fair.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n"
    "    def get(self, key):\n        return self.items.get(key)\n",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize "
    "foods from carbon dioxide and water. It generally involves the green pigment chlorophyll and generates "
    "oxygen as a byproduct, mainly inside organelles called chloroplasts.",
    "<|im_start|>user\nWrite a short story about a robot who learns to paint, and explain why it matters for "
    "people who think machines cannot be creative.<|im_end|>\n<|im_start|>assistant\nOnce upon a time, in a "
    "quiet workshop at the edge of a busy city, there lived a small robot named Pix.",
)


def hf_model(folder: Path, bf16_weights: bool) -> torch.nn.Module:
    """transformers' fp32 eager model of `folder`, optionally with every weight rounded to bf16."""
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    return round_weights_to_bf16(model) if bf16_weights else model


def simulated(model: torch.nn.Module, **roundings: bool) -> Callable[[list[int]], torch.Tensor]:
    """A logits function for `model` with the chosen bf16 roundings active during each forward."""

    def run(tokens: list[int]) -> torch.Tensor:
        with bf16_roundings(model, **roundings):
            return hf_logits(model, tokens)

    return run


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """fp32 logits [len(tokens), vocab] of one full forward."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def int8_terms(
    x: torch.Tensor, two_terms_above: float | None, counts: list[int], block: int = 32
) -> torch.Tensor:
    """x as the int8 path multiplies it, per `block` positions of its last dimension: one int8 term
    (`two_terms_above` inf), two (None), or two in the blocks whose max|x| exceeds `two_terms_above` times
    their RMS. `counts` gains the blocks seen and those given two terms."""
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    peak = blocks.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    step = peak / 127
    first = torch.round(blocks / step)
    second = torch.round((blocks / step - first) * 256).clamp(-127, 127)
    one, two = step * first, step * (first + second / 256)
    if two_terms_above is None:
        wide = torch.ones_like(peak, dtype=torch.bool)
    else:
        wide = peak > two_terms_above * blocks.pow(2).mean(-1, keepdim=True).sqrt()
    counts[0] += wide.numel()
    counts[1] += int(wide.sum())
    return torch.where(wide, two, one).reshape(x.shape)


def int8_inputs(
    model: torch.nn.Module, two_terms_above: float | None, counts: list[int], block: int
) -> Callable[[list[int]], torch.Tensor]:
    """A logits function for `model` with every linear layer's input taken as `int8_terms` takes it."""

    def run(tokens: list[int]) -> torch.Tensor:
        handles = [
            m.register_forward_pre_hook(
                lambda _m, args: (int8_terms(args[0], two_terms_above, counts, block), *args[1:])
            )
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        ]
        try:
            return hf_logits(model, tokens)
        finally:
            for handle in handles:
                handle.remove()

    return run


def our_logits(model, tokens: list[int]) -> torch.Tensor:
    """Our paged model's logits at every position of one full prefill."""
    kv = allocate_kv_cache(model.arch, 16, 16, model.dtype)
    meta = build_attention_metadata([SeqSlice(list(range(16)), 0, len(tokens))], 16)
    with torch.no_grad():
        return model(torch.tensor(tokens), meta.positions, meta, kv, torch.arange(len(tokens))).float()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).norm() / ref.norm()).item()


def main() -> None:
    folder = Path(embedded_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompts = [(tokenizer(t)["input_ids"] * 3)[:PROMPT_LEN] for t in TEXTS]
    orig, same = hf_model(folder, bf16_weights=False), hf_model(folder, bf16_weights=True)
    ref_orig = [hf_logits(orig, p) for p in prompts]
    ref_same = [hf_logits(same, p) for p in prompts]

    ours = load_model(str(folder), dtype=torch.bfloat16)[0]
    ours_math = load_model(str(folder), dtype=torch.bfloat16, compute_dtype=torch.bfloat16)[0]
    ours_gguf = load_model(None, dtype=torch.bfloat16, compute_dtype=torch.bfloat16, quantization="gguf")[0]
    hf_bf16 = hf_model(folder, bf16_weights=False).to(torch.bfloat16)
    floor = simulated(same, linear_inputs=True, linear_outputs=True)
    rows_spec: list[tuple[str, Callable[[list[int]], torch.Tensor]]] = [
        ("simulated: weights", lambda p: hf_logits(same, p)),
        ("simulated: weights + kv cache", simulated(same, kv=True)),
        ("simulated: weights + linear inputs", simulated(same, linear_inputs=True)),
        ("simulated: weights + linear inputs + kv cache", simulated(same, linear_inputs=True, kv=True)),
        ("simulated: weights + linear inputs + outputs", floor),
        ("measured: sarathi bfloat16 (fp32 math)", lambda p: our_logits(ours, p)),
        ("measured: sarathi bf16 math", lambda p: our_logits(ours_math, p)),
        ("measured: transformers bf16", lambda p: hf_logits(hf_bf16, p)),
        ("simulated: exact weights, linear inputs + kv cache", simulated(orig, linear_inputs=True, kv=True)),
        ("measured: sarathi gguf (file's blocks, bf16 math)", lambda p: our_logits(ours_gguf, p)),
    ]
    # the int8 path's activations, on the exact weights: [blocks seen, blocks with two terms] per row
    int8_counts: dict[str, list[int]] = {}
    for label, above, block in (
        ("1 term (llama.cpp's Q8_0)", float("inf"), 32),
        ("1 term per 16 positions", float("inf"), 16),
        ("1 term per 8 positions", float("inf"), 8),
        ("2 terms (ours)", None, 32),
        ("2 terms if max > 2.5 rms", 2.5, 32),
        ("2 terms if max > 3.5 rms", 3.5, 32),
        ("2 terms if max > 5 rms", 5.0, 32),
    ):
        name = f"simulated: exact weights, int8 inputs, {label}"
        counts = int8_counts[name] = [0, 0]
        rows_spec.append((name, int8_inputs(orig, above, counts, block)))
    rows = []
    width = max(len(label) for label, _ in rows_spec)
    print(f"{'rounded':{width}s} {'vs same weights':>22s} {'vs orig':>22s}   (mean / max over prompts)")
    for label, fn in rows_spec:
        outs = [fn(p) for p in prompts]
        same_errs = [rel_err(o, r) for o, r in zip(outs, ref_same, strict=True)]
        orig_errs = [rel_err(o, r) for o, r in zip(outs, ref_orig, strict=True)]
        row = {
            "config": label,
            "vs_same_weights_mean": statistics.mean(same_errs),
            "vs_same_weights_max": max(same_errs),
            "vs_orig_mean": statistics.mean(orig_errs),
            "vs_orig_max": max(orig_errs),
        }
        share = ""
        if label in int8_counts:
            seen, wide = int8_counts[label]
            row["two_term_blocks"] = wide / seen
            share = f"   (two terms in {wide / seen:.0%} of blocks)"
        rows.append(row)
        print(
            f"{label:{width}s} {row['vs_same_weights_mean']:10.2e} / {row['vs_same_weights_max']:8.2e}"
            f" {row['vs_orig_mean']:10.2e} / {row['vs_orig_max']:8.2e}{share}",
            flush=True,
        )
    path = save_result("bf16_error_budget", rows, {"prompts": len(prompts), "prompt_len": PROMPT_LEN})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
