"""``sarathi generate "prompt" [...]``: run the offline engine on a few prompts and print the outputs."""

from __future__ import annotations

import argparse
import sys

from sarathi.entrypoints.args import add_engine_args, engine_config_from_args
from sarathi.metrics import LatencySummary
from sarathi.sampling_params import SamplingParams


def add_parser(sub) -> argparse.ArgumentParser:
    gen = sub.add_parser("generate", help="generate completions (or chat replies) for prompts")
    gen.add_argument("prompts", nargs="+", help="prompt texts")
    gen.add_argument("--chat", action="store_true", help="treat each prompt as a user message")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_engine_args(gen)
    gen.set_defaults(run=run)
    return gen


def run(args: argparse.Namespace) -> int:
    from sarathi.entrypoints.llm import LLM

    try:
        config = engine_config_from_args(args)
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.sampling_seed,
            stop=tuple(args.stop),
        )
        llm = LLM(config=config)
        if args.chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
        else:
            outputs = llm.generate(args.prompts, params)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for prompt, out in zip(args.prompts, outputs, strict=True):
        print(f"--- {prompt!r} ({out.finish_reason}, {len(out.token_ids)} tokens)\n{out.text}")
    s = LatencySummary.of([o.metrics for o in outputs])
    print(
        f"--- {s.num_requests} requests: TTFT p50 {s.ttft_p50 * 1e3:.0f} ms, "
        f"TBT p50 {s.tbt_p50 * 1e3:.0f} ms, p99 {s.tbt_p99 * 1e3:.0f} ms, {s.output_tokens_per_s:.1f} tok/s"
    )
    return 0
