"""Soak test of a live ``sarathi serve``: many requests above capacity, client aborts and bad inputs mixed in.

Starts the server on 127.0.0.1 (a free port), replays ``--num-requests`` requests with Poisson arrivals at
``--qps`` and records how each ended: completed, refused with 429, aborted by the client, or refused as bad
input with a 4xx. Anything else (a 5xx, a broken stream, a connection error) is a failure. Samples the
server processes' RSS and open file descriptors while it runs and checks, once drained, that no request
is running or waiting and that every KV block is free. Prints a summary and writes it as JSON.

    python -m benchmarks.soak --num-requests 2000 --qps 3.4 --output benchmarks/results/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

from benchmarks.server import RunningServer, free_port, serve_command

BAD_BODIES = [
    b'{"prompt": "hi", "max_tokens": ',
    b'{"prompt": [true, false]}',
    b'{"prompt": "hi", "min_tokens": 1, "max_tokens": 4, "stop_token_ids": [999999]}',
    b'{"prompt": "\\ud800", "max_tokens": 2}',
    b'{"prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}",
    b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b'{"prompt": "hi", "temperature": -1}',
    b'{"prompt": "hi", "stop": ["' + b"x" * 3000 + b'"]}',
    b'{"messages": [], "max_tokens": 2}',
]


def _proc_stats(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of a process, (nan, -1) if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, StopIteration, ProcessLookupError):
        return float("nan"), -1


async def _one(client: httpx.AsyncClient, url: str, kind: str, rng: random.Random, i: int) -> str:
    """Send one request; returns its outcome."""
    if kind == "bad":
        body = BAD_BODIES[i % len(BAD_BODIES)]
        endpoint = "chat/completions" if b"messages" in body else "completions"
        r = await client.post(
            f"{url}/v1/{endpoint}", content=body, headers={"content-type": "application/json"}
        )
        ok = 400 <= r.status_code < 500 and set(r.json().get("error", {})) == {
            "message",
            "type",
            "param",
            "code",
        }
        return "bad_refused" if ok else f"fail_{r.status_code}"
    body = {
        "prompt": f"Request {i}: " + "tell me about the history of computing " * rng.randint(1, 12),
        "max_tokens": rng.randint(8, 64),
        "temperature": 0,
        "ignore_eos": True,
    }
    if kind == "plain":
        r = await client.post(f"{url}/v1/completions", json=body)
        if r.status_code == 429:
            return "refused_429"
        return (
            "completed"
            if r.status_code == 200 and r.json()["choices"][0]["finish_reason"]
            else f"fail_{r.status_code}"
        )
    abort_after = rng.randint(1, 6) if kind == "abort" else None
    received = 0
    async with client.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code == 429:
            return "refused_429"
        if r.status_code != 200:
            return f"fail_{r.status_code}"
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "completed"
            if "error" in json.loads(line[6:]):
                return "fail_error_event"
            received += 1
            if abort_after is not None and received >= abort_after:
                return "aborted"
    return "fail_stream_cut"


async def _replay(url: str, num_requests: int, qps: float, abort_share: float, bad_share: float, seed: int):
    rng = random.Random(seed)
    kinds = []
    for _ in range(num_requests):
        x = rng.random()
        kinds.append(
            "bad"
            if x < bad_share
            else "abort"
            if x < bad_share + abort_share
            else rng.choice(["stream", "stream", "plain"])
        )
    outcomes: dict[str, int] = {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start, tasks = time.monotonic(), []
        t = 0.0
        for i, kind in enumerate(kinds):
            t += rng.expovariate(qps)
            await asyncio.sleep(max(0.0, start + t - time.monotonic()))
            tasks.append(asyncio.create_task(_one(client, url, kind, random.Random(seed * 100_003 + i), i)))
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            key = result if isinstance(result, str) else f"fail_{type(result).__name__}"
            outcomes[key] = outcomes.get(key, 0) + 1
    return outcomes, time.monotonic() - start


async def _sample(pids: dict[str, int], samples: list, stop: asyncio.Event, every_s: float) -> None:
    while not stop.is_set():
        samples.append(
            {
                "t": time.monotonic(),
                **{
                    f"{k}_{m}": v
                    for k, pid in pids.items()
                    for m, v in zip(("rss_mib", "fds"), _proc_stats(pid), strict=True)
                },
            }
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _main(args: argparse.Namespace, server: RunningServer) -> dict:
    pids = {"api": server.pid, "engine": server.config()["engine_core_pid"]}
    samples: list[dict] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(pids, samples, stop, 5.0))
    outcomes, wall = await _replay(
        server.url, args.num_requests, args.qps, args.abort_share, args.bad_share, args.seed
    )
    await asyncio.sleep(3)  # aborted requests are freed before the engine's next iteration
    stop.set()
    await sampler
    return {"outcomes": outcomes, "wall_s": wall, "samples": samples}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--qps", type=float, default=3.4)
    p.add_argument("--abort-share", type=float, default=0.2)
    p.add_argument("--bad-share", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="JSON file for the summary")
    p.add_argument("serve_flags", nargs="*", help="flags for sarathi serve (after --)")
    args = p.parse_args()
    port = free_port()
    server = RunningServer(serve_command(port, *(args.serve_flags or ["--max-waiting", "64"])), port)
    try:
        result = asyncio.run(_main(args, server))
        m = server.metrics()
        result["end"] = {
            "running": m["sarathi_num_requests_running"],
            "waiting": m["sarathi_num_requests_waiting"],
            "kv_blocks_used": m["sarathi_kv_cache_blocks_used"],
            "health": httpx.get(f"{server.url}/health", timeout=10).status_code,
        }
    finally:
        server.stop()
    s = result["samples"]
    first, last = s[1] if len(s) > 1 else s[0], s[-1]
    result["rss_fd_first_last"] = {k: (first[k], last[k]) for k in first if k != "t"}
    result["rss_fd_max"] = {k: max(x[k] for x in s) for k in first if k != "t"}
    result["config"] = vars(args)
    failures = sum(v for k, v in result["outcomes"].items() if k.startswith("fail"))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if failures or result["end"]["kv_blocks_used"] or result["end"]["running"] else 0


if __name__ == "__main__":
    sys.exit(main())
