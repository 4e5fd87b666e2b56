"""Prefill-chunk attention at long context: our chunk kernel against gather + SDPA, side by side in one run.

Two tables, both in the bf16 fast path (bf16 weights and KV cache, bf16 math):

- one layer's attention of a chunk of n tokens whose last key is at `context` (SmolLM2's 9 / 3 heads of 64
  and Gemma 3 270M's 4 / 1 heads of 256), ms per call and GFLOP/s of the kernel (4 n context d heads);
- SmolLM2's whole forward of one stall-free iteration: one decode at `context` beside a 16-token chunk at
  the start of its prompt and at `context`, with prefill chunks on each path.

    python -m benchmarks.chunk_attention [--quick]
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

from benchmarks.forward_timing import timed
from benchmarks.record import save_result
from sarathi.model import SeqSlice, allocate_kv_cache, build_attention_metadata, kernels, load_model
from sarathi.model import llama as llama_module
from sarathi.model.paged_attention import GatherWorkspace, paged_attention, plan_cache_reads

BLOCK_SIZE = 16
SHAPES = {"SmolLM2-135M": (9, 3, 64), "Gemma 3 270M": (4, 1, 256)}
LAYER_CASES = ((0, 64), (0, 512), (500, 16), (2000, 16), (4000, 16), (2000, 64), (2000, 256), (4000, 512))
CONTEXTS = (500, 2000, 4000)


def layer_attention(heads: int, kv_heads: int, d: int, context: int, n: int, kernel: bool):
    """One layer's attention of an n-token chunk ending at `context` keys, as a callable."""
    g = torch.Generator().manual_seed(0)
    blocks = -(-context // BLOCK_SIZE)
    k_cache = torch.randn(kv_heads, blocks + 8, BLOCK_SIZE, d, generator=g).bfloat16()
    v_cache = torch.randn(kv_heads, blocks + 8, BLOCK_SIZE, d, generator=g).bfloat16()
    table = torch.randperm(blocks + 8, generator=g)[:blocks].tolist()
    meta = build_attention_metadata([SeqSlice(table, context - n, n)], BLOCK_SIZE)
    q, k, v = (torch.randn(n, h, d, generator=g) for h in (heads, kv_heads, kv_heads))
    workspace = GatherWorkspace()

    def run():
        plan = plan_cache_reads(meta, k_cache, workspace, torch.float32, bf16_chunks=kernel)
        return paged_attention(q, k, v, k_cache, v_cache, meta, plan, d**-0.5)

    return run


def iteration(model, arch, context: int, chunk_start: int):
    """One decode at `context` beside a 16-token chunk at `chunk_start`: the whole forward, as a callable."""
    blocks = -(-(context + 1) // BLOCK_SIZE)
    kv = allocate_kv_cache(arch, 2 * blocks, BLOCK_SIZE, torch.bfloat16)
    slices = [
        SeqSlice(list(range(blocks, 2 * blocks)), chunk_start, 16),
        SeqSlice(list(range(blocks)), context, 1),
    ]
    meta = build_attention_metadata(slices, BLOCK_SIZE)
    ids = torch.randint(0, arch.vocab_size, (17,), generator=torch.Generator().manual_seed(0))
    rows = torch.tensor([15, 16])
    return lambda: model(ids, meta.positions, meta, kv, rows)


def gather_and_sdpa():
    """The model's prefill chunks on gather + SDPA (float32) instead of the chunk kernel."""
    plan = llama_module.plan_cache_reads
    return mock.patch.object(
        llama_module, "plan_cache_reads", lambda *a, **kw: plan(*a, **{**kw, "bf16_chunks": False})
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    args = parser.parse_args()
    reps = 3 if args.quick else 5
    if not kernels.available():
        raise SystemExit("the chunk kernel needs our CPU kernels (a compiler and AVX512-BF16)")
    rows = []
    print("one layer, ms per call (median): SDPA | kernel | ratio | kernel GFLOP/s")
    for model_name, (heads, kv_heads, d) in SHAPES.items():
        for start, n in LAYER_CASES:
            context = start + n
            sdpa, _ = timed(layer_attention(heads, kv_heads, d, context, n, kernel=False), reps)
            ours, _ = timed(layer_attention(heads, kv_heads, d, context, n, kernel=True), reps)
            flops = 4 * n * context * d * heads
            rows.append(
                dict(
                    table="layer",
                    model=model_name,
                    chunk=n,
                    context=context,
                    sdpa_ms=sdpa * 1e3,
                    kernel_ms=ours * 1e3,
                    gflops=flops / ours / 1e9,
                )
            )
            print(
                f"{model_name:13s} chunk {n:4d} at context {context:5d}: {sdpa * 1e3:7.3f} | "
                f"{ours * 1e3:7.3f} | {sdpa / ours:4.1f}x | {flops / ours / 1e9:4.0f}"
            )
    model, arch, _ = load_model(None, dtype=torch.bfloat16, compute_dtype=torch.bfloat16)
    print("SmolLM2 forward, ms (median): one decode at context + a 16-token chunk; SDPA | kernel")
    with torch.inference_mode():
        for context in CONTEXTS:
            for start in (0, context - 16):
                with gather_and_sdpa():
                    sdpa, _ = timed(iteration(model, arch, context, start), reps)
                ours, _ = timed(iteration(model, arch, context, start), reps)
                rows.append(
                    dict(
                        table="iteration",
                        decode_context=context,
                        chunk_start=start,
                        sdpa_ms=sdpa * 1e3,
                        kernel_ms=ours * 1e3,
                    )
                )
                print(
                    f"decode at {context:5d} + chunk at {start:5d}: {sdpa * 1e3:6.1f} | {ours * 1e3:6.1f} "
                    f"({sdpa / ours:.2f}x)"
                )
    print(f"saved {save_result('chunk_attention', rows, vars(args))}")


if __name__ == "__main__":
    main()
