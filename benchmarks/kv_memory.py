"""KV-cache bytes one long sequence holds with sliding-window layers, against every layer keeping everything.

Serves one prompt of each context length (default 8,192 and 32,000 tokens) through the real engine on a model
with sliding-window layers (default: Gemma 3 270M, 15 of its 18 layers with a 512-token window) and reads
the block manager after every step: the pages the sequence's tables hold (each page is one block of KV for
one slot of a KV-cache group, so its bytes are known) while it decodes, and at the most (during the last
prefill chunks: the window before a chunk plus the chunk). "Keeps everything" is what a cache without
KV-cache groups holds: every layer, every block.

    python -m benchmarks.kv_memory [--model gemma3-270m] [--contexts 8192,32000] [--token-budget 256]

Prints the table and saves it with the machine and commit.
"""

from __future__ import annotations

import argparse
import random

import torch

from benchmarks.record import save_result
from sarathi import LLM, SamplingParams
from sarathi.model.kv_cache import kv_cache_bytes_per_block, kv_cache_shape
from sarathi.model.resolve import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--contexts", default="8192,32000")
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]

    arch = resolve_model(args.model).arch
    dtype = getattr(torch, args.dtype)
    rows = []
    with LLM(
        model=args.model,
        dtype=args.dtype,
        token_budget=args.token_budget,
        max_model_len=max(contexts) + 8,
        enable_prefix_caching=False,
    ) as llm:
        engine = llm.engine
        bm = engine.block_manager
        bs = bm.block_size
        page_bytes = kv_cache_bytes_per_block(arch, bs, dtype)
        heads, _, _, head_dim = kv_cache_shape(arch, 1, bs)
        layer_block_bytes = 2 * heads * bs * head_dim * dtype.itemsize
        rng = random.Random(0)
        for n in contexts:
            prompt = [arch.bos_token_id or 2] + [rng.randrange(3, arch.vocab_size) for _ in range(n - 1)]
            request_id = f"kv-{n}"
            engine.add_request(request_id, prompt, SamplingParams(max_tokens=4, ignore_eos=True))
            peak = decoding = 0
            while engine.has_unfinished_requests():
                outputs = engine.step().outputs
                if not bm.has_blocks(request_id):
                    continue
                held = bm.num_held_blocks(request_id)
                peak = max(peak, held)
                if any(o.request_id == request_id and o.num_output_tokens >= 2 for o in outputs):
                    decoding = max(decoding, held)  # after a decode step's blocks were taken
            everything = bm.blocks_needed(n + 1) * arch.num_hidden_layers * layer_block_bytes
            row = {
                "context": n,
                "pages_decoding": decoding,
                "pages_peak": peak,
                "bytes_decoding": decoding * page_bytes,
                "bytes_peak": peak * page_bytes,
                "bytes_all_layers_keep_everything": everything,
                "fraction": round(decoding * page_bytes / everything, 4),
            }
            rows.append(row)
            print(
                f"{n:>6} tokens: {decoding * page_bytes / 2**20:8.1f} MiB while decoding "
                f"(peak {peak * page_bytes / 2**20:.1f} MiB) vs {everything / 2**20:8.1f} MiB keeping every "
                f"layer's blocks: {row['fraction']:.3f}x"
            )
    settings = {
        "model": args.model,
        "dtype": args.dtype,
        "token_budget": args.token_budget,
        "block_size": bs,
        "page_bytes": page_bytes,
        "kv_cache_groups": [(g.window, len(g.layers)) for g in arch.kv_cache_groups],
    }
    print(f"saved {save_result('kv_memory', rows, settings)}")


if __name__ == "__main__":
    main()
