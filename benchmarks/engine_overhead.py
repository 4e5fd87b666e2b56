"""Where a decode iteration's time goes at 64 running requests: the model vs the engine around it.

Runs 64 real requests on the embedded model (in-process, the uniproc executor) and, in the iterations
where all 64 are decoding, times each part of the step by wrapping it: scheduling, step building, the
worker's request update and input preparation, the forward pass, grammar masks + sampling, the
scheduler's step accounting, detokenization + stop strings + ``RequestOutput``s, and pickling the
iteration's outputs the way the engine core sends them to the API process. The engine's overhead is
everything but the forward pass, as a share of the iteration (target: <= 5%).

    python -m benchmarks.engine_overhead [--running 64 --prompt-len 32 --output-len 48 --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from collections import defaultdict

from benchmarks.record import save_result
from sarathi.benchmark.runner import bench_params, warm_up
from sarathi.config import engine_config
from sarathi.engine.core_messages import CoreOutputs
from sarathi.entrypoints.build import build_engine

PARTS = (
    ("schedule", "scheduling"),
    ("build", "step building"),
    ("update", "worker request update"),
    ("prepare", "input preparation"),
    ("forward", "forward pass (model)"),
    ("sample", "grammar masks + sampling"),
    ("finish", "step accounting"),
    ("outputs", "detokenization + outputs"),
    ("pickle", "output message (pickle)"),
)


def _wrap(owner: object, name: str, part: str, spent: dict[str, float]) -> None:
    fn = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - start

    setattr(owner, name, timed)


def measure(running: int, prompt_len: int, output_len: int, dtype: str) -> dict:
    """Per-part medians (seconds per iteration) over the all-decode iterations with ``running`` requests."""
    engine = build_engine(
        engine_config(None, dtype=dtype, max_num_seqs=running, token_budget=max(256, running))
    )
    vocab = engine.model.vocab_size
    warm_up(engine, [11 + j for j in range(prompt_len)])
    worker = engine.executor.worker
    spent: dict[str, float] = defaultdict(float)
    _wrap(engine.scheduler, "schedule", "schedule", spent)
    _wrap(engine.step_builder, "build", "build", spent)
    _wrap(worker, "_update_requests", "update", spent)
    _wrap(worker.runner, "prepare", "prepare", spent)
    _wrap(worker.runner, "run", "forward", spent)
    _wrap(worker.sampler, "sample", "sample", spent)
    _wrap(worker.grammars, "apply", "sample", spent)
    _wrap(engine.scheduler, "finish_step", "finish", spent)
    _wrap(engine.outputs, "token_output", "outputs", spent)
    for i in range(running):
        prompt = [(7 + 131 * i + 17 * j) % vocab for j in range(prompt_len)]
        engine.add_request(f"r{i}", prompt, bench_params(output_len))
    rows: list[dict[str, float]] = []
    while engine.has_unfinished_requests():
        spent.clear()
        start = time.perf_counter()
        result = engine.step()
        t0 = time.perf_counter()
        pickle.dumps(CoreOutputs(outputs=result.outputs, iterations=[result.iteration]), protocol=5)
        spent["pickle"] += time.perf_counter() - t0
        total = time.perf_counter() - start
        stats = engine.stats[-1]
        if stats.num_prefill_tokens == 0 and stats.num_decode_tokens == running:
            rows.append({**spent, "total": total})
    if not rows:
        raise RuntimeError("no iteration ran all requests as decodes; raise --output-len")
    medians = {part: statistics.median(r.get(part, 0.0) for r in rows) for part, _ in PARTS}
    medians["total"] = statistics.median(r["total"] for r in rows)
    overheads = [(r["total"] - r.get("forward", 0.0)) / r["total"] for r in rows]
    return {
        "iterations": len(rows),
        "median_s": medians,
        "overhead_share_median": statistics.median(overheads),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    result = measure(args.running, args.prompt_len, args.output_len, args.dtype)
    m = result["median_s"]
    print(
        f"{args.running} running decodes, {args.dtype}, median over {result['iterations']} iterations "
        f"(ms per iteration, share of the iteration)"
    )
    for part, label in PARTS:
        print(f"  {label:30s} {m[part] * 1e3:8.2f} ms  {m[part] / m['total']:6.1%}")
    print(f"  {'whole iteration':30s} {m['total'] * 1e3:8.2f} ms")
    print(f"engine overhead (all but the forward pass): {result['overhead_share_median']:.1%} (target <= 5%)")
    save_result("engine_overhead", {"args": vars(args), **result})


if __name__ == "__main__":
    main()
