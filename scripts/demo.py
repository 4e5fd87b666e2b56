"""``make demo``: stall-free batching vs the baselines, measured under load on the embedded SmolLM2-135M.

ShareGPT request lengths (scaled down so the run fits a small CPU) arrive as a Poisson process at a rate
where new prompts keep arriving while earlier requests decode. Every scheduler sees the same requests at
the same times, in-process. Prefill-first schedulers (vllm, orca) stall every running decode for whole
prompts, which shows as a long tail of time-between-tokens; faster_transformer never mixes prompts into a
running batch, so requests wait long to be scheduled; sarathi chunks prompts under the token budget and
keeps decodes going. Prints the table and writes summary.json, CSVs and plots to ``--output-dir``.

The Figure 7 demo that ``make demo`` ran before is ``scripts/figure7.py``.
"""

from __future__ import annotations

import argparse
import sys

from sarathi.entrypoints.cli import main as sarathi_main

SCHEDULERS = "sarathi,vllm,orca,faster_transformer"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--schedulers", default=SCHEDULERS)
    parser.add_argument("--trace", default="sharegpt")
    parser.add_argument("--length-scale", type=float, default=0.15)
    parser.add_argument("--max-total-tokens", type=int, default=1024)
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--qps", type=float, default=0.5)
    parser.add_argument("--token-budget", default="64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--output-dir", default="demo_results")
    args = parser.parse_args()
    print(
        f"{args.num_requests} {args.trace} requests (lengths x{args.length_scale:g}, at most "
        f"{args.max_total_tokens} tokens), Poisson arrivals at {args.qps:g} QPS, token budget "
        f"{args.token_budget}, SmolLM2-135M {args.dtype}; schedulers: {args.schedulers}",
        file=sys.stderr,
    )
    return sarathi_main(
        [
            "bench",
            "--schedulers",
            args.schedulers,
            "--trace",
            args.trace,
            "--length-scale",
            str(args.length_scale),
            "--max-total-tokens",
            str(args.max_total_tokens),
            "--num-requests",
            str(args.num_requests),
            "--qps",
            str(args.qps),
            "--arrival",
            "poisson",
            "--token-budget",
            args.token_budget,
            "--seed",
            str(args.seed),
            "--dtype",
            args.dtype,
            "--output-dir",
            args.output_dir,
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
