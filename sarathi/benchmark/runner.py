"""In-process driver: replays a workload on an ``LLMEngine`` with exact arrival times.

A request is added as soon as its arrival time has passed (between iterations, as a server's engine loop
would), stamped with that exact arrival time, so the time it waited for a running iteration to end counts
in its latencies. When nothing is running the driver sleeps until the next arrival.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sarathi.benchmark.chat_workload import ChatSession
from sarathi.benchmark.metrics_store import MetricsStore
from sarathi.benchmark.workload import BenchRequest
from sarathi.engine.llm_engine import StepResult
from sarathi.sampling_params import SamplingParams

# Iterations that produce nothing while requests are unfinished before the driver gives up.
_MAX_IDLE_STEPS = 10_000


def bench_params(num_output_tokens: int) -> SamplingParams:
    """Greedy, exactly ``num_output_tokens`` tokens (EOS ignored)."""
    return SamplingParams(temperature=0.0, max_tokens=num_output_tokens, ignore_eos=True)


def warm_up(engine, prompt_token_ids: Sequence[int], num_output_tokens: int = 4) -> None:
    """Run one small request to completion so one-time costs (weight packing, allocator growth) are paid
    before the measured run; the prefix cache is then emptied so the run starts cold."""
    engine.add_request("warmup", list(prompt_token_ids), bench_params(num_output_tokens))
    while engine.has_unfinished_requests():
        engine.step()
    engine.take_stage_timings()
    engine.block_manager.reset_prefix_cache()


class _FixedArrivals:
    """A workload whose requests all have known arrival times (the ``ChatSession`` interface)."""

    def __init__(self, requests: Sequence[BenchRequest]) -> None:
        self._pending = sorted(requests, key=lambda r: r.arrival_time)
        self._next = 0
        self.num_requests = len(self._pending)

    @property
    def done(self) -> bool:
        return self._next == len(self._pending)

    def next_arrival(self) -> float | None:
        return None if self.done else self._pending[self._next].arrival_time

    def pop_due(self, now: float) -> list[BenchRequest]:
        start = self._next
        while self._next < len(self._pending) and self._pending[self._next].arrival_time <= now:
            self._next += 1
        return self._pending[start : self._next]

    def on_finish(self, request_id: str, output_token_ids: list[int], now: float) -> None:
        pass


class StoreFeeder:
    """Feeds one engine's completed iterations, stage timings and request outputs into a metrics store."""

    def __init__(self, engine, store: MetricsStore, on_finish=None) -> None:
        self.engine = engine
        self.store = store
        self.on_finish = on_finish  # called with each request's final output
        self.num_finished = 0

    def after_step(self, result: StepResult) -> bool:
        """Record what ``engine.step()`` produced; True when it completed an iteration."""
        engine, store = self.engine, self.store
        if result.iteration is not None:
            store.on_iteration(result.iteration)
            store.on_stage_timings(engine.take_stage_timings())
        for out in result.outputs:
            rid = out.request_id
            for _ in out.new_token_ids:
                store.on_token(rid, out.token_time)
            if out.finished:
                m = out.metrics  # a request's final output carries its metrics
                if m.first_scheduled_time is not None:
                    store.on_scheduled(rid, m.first_scheduled_time)
                store.on_finish(rid, m.finished_time, m.num_preemptions)
                self.num_finished += 1
                if self.on_finish is not None:
                    self.on_finish(out)
        return result.iteration is not None


def run_in_process(
    engine,
    requests: Sequence[BenchRequest] | ChatSession,
    store: MetricsStore | None = None,
    progress: bool = False,
    desc: str | None = None,
) -> MetricsStore:
    """Replay ``requests`` (arrival offsets from now) on ``engine``; return the filled metrics store.

    ``requests`` may be a ``ChatSession``, whose turns arrive as earlier turns finish.
    """
    store = store if store is not None else MetricsStore()
    if not isinstance(requests, ChatSession):
        if any(not r.prompt_token_ids for r in requests):
            raise ValueError(
                "every request needs prompt token ids (generate the workload with a token space)"
            )
        requests = _FixedArrivals(requests)
    source = requests
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=source.num_requests, desc=desc, unit="req", leave=False)
    t0 = time.monotonic()

    def on_finish(out) -> None:
        source.on_finish(out.request_id, list(out.token_ids), out.metrics.finished_time - t0)

    feeder = StoreFeeder(engine, store, on_finish)
    idle = 0
    try:
        while not source.done or engine.has_unfinished_requests():
            for r in source.pop_due(time.monotonic() - t0):
                arrival = t0 + r.arrival_time
                engine.add_request(
                    r.request_id, list(r.prompt_token_ids), bench_params(r.num_output_tokens), arrival
                )
                store.on_arrival(r.request_id, arrival, r.num_prompt_tokens, r.num_output_tokens)
            if not engine.has_unfinished_requests():
                next_arrival = source.next_arrival()
                if next_arrival is None:
                    raise RuntimeError("the workload is waiting for requests that are not running")
                time.sleep(max(0.0, t0 + next_arrival - time.monotonic()))
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
