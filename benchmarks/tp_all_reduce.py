"""The tensor-parallel all-reduce on this machine: gloo's against the shared-memory one, then the engine's
decode step at TP 2 with each beside one process.

Part 1 times ``--calls`` sum all-reduces of float32 activations of a decode step (4 rows), a batch (64) and a
chunk (256) of SmolLM2's width between two spawned ranks (1 thread each), through gloo and through shared
memory, alternated by round. Part 2 runs the embedded model in float32 (``--dtype``) on 4 requests of
``--max-tokens`` greedy tokens: one process, then TP 2 over gloo and over shared memory, and reports the
median decode-step time of each. Prints a table and saves
benchmarks/results/tp-all-reduce-<date>-<commit>.json.

    .venv/bin/python -m benchmarks.tp_all_reduce            # ~1.5 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from benchmarks.record import save_result

HIDDEN = 576  # SmolLM2-135M's width
ROWS = (4, 64, 256)
PROMPTS = [[1, 2, 3] * 30, [5, 6, 7] * 20, [9] * 50, [11, 12] * 40]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time_rank(rank: int, port: int, calls: int, rounds: int, out: str) -> None:
    from sarathi.model import ShardSpec, init_distributed

    torch.set_num_threads(1)
    shard = ShardSpec(tp_rank=rank, tp_size=2)
    ctx = init_distributed(shard, f"tcp://127.0.0.1:{port}", timeout_s=60, shared_memory=True)
    group, shared = ctx.tp_group, ctx.tp_group.shared
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for rows in ROWS:
            x = torch.randn(rows, HIDDEN)
            for path in ("gloo", "shm"):
                group.shared = shared if path == "shm" else None
                for _ in range(10):
                    group.all_reduce(x)
                start = time.perf_counter()
                for _ in range(calls):
                    group.all_reduce(x)
                times.setdefault(f"{path}-{rows}", []).append((time.perf_counter() - start) / calls)
    group.shared = shared
    if rank == 0:
        torch.save(times, out)
    ctx.destroy()


def time_all_reduce(calls: int, rounds: int) -> dict[str, float]:
    """Median microseconds per call, by path and rows."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tp-all-reduce-{os.getpid()}.pt"
    mp.start_processes(
        _time_rank, args=(_free_port(), calls, rounds, str(out)), nprocs=2, start_method="spawn"
    )
    times = torch.load(out)
    out.unlink()
    return {key: statistics.median(v) * 1e6 for key, v in times.items()}


def decode_step_ms(dtype: str, max_tokens: int, shared: bool | None, tp: int) -> float:
    """Median decode-step wall time of the engine on PROMPTS (after a warm-up generate)."""
    from sarathi import LLM, SamplingParams
    from sarathi.model.parallel import ALL_REDUCE_ENV

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    before = os.environ.get(ALL_REDUCE_ENV)
    os.environ[ALL_REDUCE_ENV] = {None: "auto", False: "gloo", True: "shm"}[shared]  # the workers inherit it
    try:
        llm = LLM(dtype=dtype, token_budget=64, num_kv_blocks=512, tensor_parallel_size=tp)
        try:
            llm.generate(PROMPTS, params, use_tqdm=False)
            done = len(llm.engine.stats)
            llm.generate(PROMPTS, params, use_tqdm=False)
            steps = list(llm.engine.stats)[done:]
        finally:
            llm.engine.shutdown()
    finally:
        if before is None:
            os.environ.pop(ALL_REDUCE_ENV, None)
        else:
            os.environ[ALL_REDUCE_ENV] = before
    return statistics.median(s.wall_time * 1e3 for s in steps if s.num_prefill_tokens == 0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    micro = time_all_reduce(args.calls, args.rounds)
    print("all-reduce of float32 [rows, 576] between 2 ranks, us per call (median of rounds):")
    for rows in ROWS:
        g, s = micro[f"gloo-{rows}"], micro[f"shm-{rows}"]
        print(f"  {rows:4d} rows: gloo {g:8.1f}   shared memory {s:7.1f}   ({g / s:.0f}x)")
    steps = {
        "one process": decode_step_ms(args.dtype, args.max_tokens, None, 1),
        "TP 2, gloo": decode_step_ms(args.dtype, args.max_tokens, False, 2),
        "TP 2, shared memory": decode_step_ms(args.dtype, args.max_tokens, True, 2),
    }
    print(f"decode step of {len(PROMPTS)} sequences, SmolLM2 {args.dtype}, median ms:")
    for name, ms in steps.items():
        print(f"  {name:20s} {ms:6.1f}")
    if not args.no_save:
        rows = [{"kind": "all_reduce_us", **micro}, {"kind": "decode_step_ms", **steps}]
        path = save_result("tp-all-reduce", rows, vars(args))
        print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
