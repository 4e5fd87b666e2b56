"""The paper's Figure 7 situation on the embedded SmolLM2-135M, under each scheduler (``make demo`` was
this script before it became a load benchmark; run it with ``python -m benchmarks.figure7``).

Six chat requests start decoding; a few iterations later two long prompts arrive. A prefill-first scheduler
(vllm, orca) stalls the running decodes while it processes the long prompts whole; sarathi chunks them and
piggybacks the chunks on the decodes, so the worst time-between-tokens stays bounded by the token budget.
"""

from __future__ import annotations

import argparse
import inspect
import time

from sarathi import LLM, SamplingParams
from sarathi.config import DEFAULT_TOKEN_BUDGET, SCHEDULER_NAMES
from sarathi.metrics import LatencySummary

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for learning to play the guitar.",
    "Explain what a hash table is in two sentences.",
    "Write a haiku about autumn rain.",
    "Why is the sky blue?",
    "Name three planets of the solar system.",
]


def long_document() -> str:
    import argparse as a
    import json
    import logging

    return "\n\n".join(inspect.getdoc(m) or "" for m in (a, json, logging))


def run(llm: LLM, long_tokens: int, arrive_after: int, max_tokens: int):
    engine, tok = llm.engine, llm.get_tokenizer()
    short = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    doc = tok.encode(long_document())[:long_tokens]
    summary = tok.apply_chat_template([{"role": "user", "content": "Summarize:\n" + tok.decode(doc)}])
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for i, p in enumerate(short):
        engine.add_request(f"short-{i}", p, params)
    outputs, steps = {}, 0
    start = time.monotonic()
    while engine.has_unfinished_requests():
        if steps == arrive_after:
            for i in range(2):
                engine.add_request(f"long-{i}", summary, params)
        for out in engine.step().outputs:
            if out.finished:
                outputs[out.request_id] = out
        steps += 1
    return outputs, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--schedulers", nargs="+", default=list(SCHEDULER_NAMES))
    parser.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    parser.add_argument("--long-tokens", type=int, default=1200, help="length of each late long prompt")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    rows = []
    for name in args.schedulers:
        llm = LLM(scheduler=name, token_budget=args.token_budget, dtype=args.dtype)
        outputs, wall = run(llm, args.long_tokens, arrive_after=4, max_tokens=args.max_tokens)
        if not rows:
            print(f"\nAnswers ({name}, greedy):")
            for i, q in enumerate(QUESTIONS):
                print(f"  Q: {q}\n  A: {outputs[f'short-{i}'].text.strip()}\n")
        short = LatencySummary.of([o.metrics for k, o in outputs.items() if k.startswith("short")])
        every = LatencySummary.of([o.metrics for o in outputs.values()])
        rows.append((name, wall, every, short))

    print(
        f"SmolLM2-135M {args.dtype}, token budget {args.token_budget}, "
        f"6 chats + 2 late {args.long_tokens}-token prompts"
    )
    print(
        f"{'scheduler':<20}{'wall s':>8}{'TTFT p50':>10}{'TTFT p99':>10}{'TBT p50':>9}{'TBT p99':>9}"
        f"{'TBT max':>9}{'short TBT max':>15}{'tok/s':>8}"
    )
    for name, wall, s, short in rows:
        print(
            f"{name:<20}{wall:>8.2f}{s.ttft_p50 * 1e3:>8.0f}ms{s.ttft_p99 * 1e3:>8.0f}ms"
            f"{s.tbt_p50 * 1e3:>7.0f}ms{s.tbt_p99 * 1e3:>7.0f}ms{s.tbt_max * 1e3:>7.0f}ms"
            f"{short.tbt_max * 1e3:>13.0f}ms{s.output_tokens_per_s:>8.1f}"
        )


if __name__ == "__main__":
    main()
