"""In-process driver: replays a workload on an ``LLMEngine`` with exact arrival times.

A request is added as soon as its arrival time has passed (between iterations, as a server's engine loop
would), stamped with that exact arrival time, so the time it waited for a running iteration to end counts
in its latencies. When nothing is running the driver sleeps until the next arrival.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sarathi.benchmark.metrics_store import MetricsStore
from sarathi.benchmark.workload import BenchRequest
from sarathi.sampling_params import SamplingParams

# Iterations that produce nothing while requests are unfinished before the driver gives up.
_MAX_IDLE_STEPS = 10_000


def bench_params(num_output_tokens: int) -> SamplingParams:
    """Greedy, exactly ``num_output_tokens`` tokens (EOS ignored)."""
    return SamplingParams(temperature=0.0, max_tokens=num_output_tokens, ignore_eos=True)


def warm_up(engine, prompt_token_ids: Sequence[int], num_output_tokens: int = 4) -> None:
    """Run one small request to completion so one-time costs (weight packing, allocator growth) are paid
    before the measured run."""
    engine.add_request("warmup", list(prompt_token_ids), bench_params(num_output_tokens))
    while engine.has_unfinished_requests():
        engine.step()
    engine.take_stage_timings()


class StoreFeeder:
    """Feeds one engine's completed iterations, stage timings and request outputs into a metrics store."""

    def __init__(self, engine, store: MetricsStore) -> None:
        self.engine = engine
        self.store = store
        self.last_iteration = engine.stats[-1].iteration if engine.stats else -1
        self.num_finished = 0

    def after_step(self, outputs) -> bool:
        """Record what ``engine.step()`` produced; True when it completed an iteration."""
        engine, store = self.engine, self.store
        stats = engine.stats[-1] if engine.stats else None
        completed = stats is not None and stats.iteration != self.last_iteration
        if completed:
            self.last_iteration = stats.iteration
            store.on_iteration(stats)
            store.on_stage_timings(engine.take_stage_timings())
        for out in outputs:
            rid = out.request_id
            for _ in out.new_token_ids:
                store.on_token(rid, out.token_time)
            if out.finished:
                m = out.metrics  # a request's final output carries its metrics
                if m.first_scheduled_time is not None:
                    store.on_scheduled(rid, m.first_scheduled_time)
                store.on_finish(rid, m.finished_time, m.num_preemptions)
                self.num_finished += 1
        return completed


def run_in_process(
    engine,
    requests: Sequence[BenchRequest],
    store: MetricsStore | None = None,
    progress: bool = False,
    desc: str | None = None,
) -> MetricsStore:
    """Replay ``requests`` (arrival offsets from now) on ``engine``; return the filled metrics store."""
    store = store if store is not None else MetricsStore()
    pending = sorted(requests, key=lambda r: r.arrival_time)
    if any(not r.prompt_token_ids for r in pending):
        raise ValueError("every request needs prompt token ids (generate the workload with a token space)")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(pending), desc=desc, unit="req", leave=False)
    feeder = StoreFeeder(engine, store)
    next_i, idle = 0, 0
    t0 = time.monotonic()
    try:
        while next_i < len(pending) or engine.has_unfinished_requests():
            now = time.monotonic()
            while next_i < len(pending) and t0 + pending[next_i].arrival_time <= now:
                r = pending[next_i]
                arrival = t0 + r.arrival_time
                engine.add_request(
                    r.request_id, list(r.prompt_token_ids), bench_params(r.num_output_tokens), arrival
                )
                store.on_arrival(r.request_id, arrival, r.num_prompt_tokens, r.num_output_tokens)
                next_i += 1
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, t0 + pending[next_i].arrival_time - time.monotonic()))
                continue
            if feeder.after_step(engine.step()):
                idle = 0
            else:
                idle += 1
                if idle > _MAX_IDLE_STEPS:
                    raise RuntimeError("the engine stopped making progress with requests unfinished")
            if bar is not None and feeder.num_finished > bar.n:
                bar.update(feeder.num_finished - bar.n)
    finally:
        if bar is not None:
            bar.close()
    return store
