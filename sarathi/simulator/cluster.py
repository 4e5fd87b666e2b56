"""The discrete-event loop: requests arrive in simulated time, a router sends each to a replica, and every
replica is the engine's own ``LLMEngine`` (scheduler, block manager, step loop) over a simulated executor.

Each replica has its own clock, which stands at the end of its last iteration. The loop always handles the
earliest event: the next arrival, or the next iteration of the busy replica whose clock is furthest behind.
An arrival that comes while a replica is mid-iteration waits for that iteration to end, as it would in the
real engine; an idle replica's clock jumps to the arrival.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sarathi.benchmark.metrics_store import MetricsStore
from sarathi.benchmark.runner import StoreFeeder, bench_params
from sarathi.benchmark.workload import BenchRequest, TokenSpace, WorkloadConfig, generate_workload
from sarathi.config import EngineConfig
from sarathi.core.latency_model import LatencyModel
from sarathi.core.schedulers.adaptive_budget import AdaptiveBudget
from sarathi.engine.llm_engine import LLMEngine
from sarathi.executor.assemble import assemble_engine
from sarathi.model.kv_cache import kv_blocks_for
from sarathi.model.resolve import resolve_model
from sarathi.simulator.clock import SimulatedClock
from sarathi.simulator.executor import SimulatedExecutor

ROUTERS = ("round_robin", "least_outstanding")
_MAX_IDLE_STEPS = 10_000


@dataclass
class Replica:
    """One simulated engine and its clock."""

    engine: LLMEngine
    clock: SimulatedClock
    feeder: StoreFeeder | None = None


def make_replica(config: EngineConfig, latency_model: LatencyModel) -> Replica:
    """An ``LLMEngine`` for ``config`` whose executor charges ``latency_model`` on its own clock.

    ``config`` should describe the model without weights (``load_format="dummy"`` and ``hf_config``, see
    ``simulation_config``); nothing is loaded either way, since the executor never builds workers.
    """
    clock = SimulatedClock()

    def factory(cfg: EngineConfig, num_kv_blocks: int, eos_token_ids: tuple[int, ...]) -> SimulatedExecutor:
        token = next(t for t in itertools.count() if t not in eos_token_ids)
        return SimulatedExecutor(latency_model, clock, token_id=token)

    slo = config.scheduler.adaptive_tbt_slo
    controller = None if slo is None else AdaptiveBudget(slo, copy.deepcopy(latency_model))
    engine = assemble_engine(config, budget_controller=controller, executor_factory=factory, clock=clock)
    return Replica(engine, clock)


class Router:
    """Picks the replica for each arrival: round robin, or the one with the fewest unfinished requests
    (ties to the lowest index)."""

    def __init__(self, policy: str = "round_robin") -> None:
        if policy not in ROUTERS:
            raise ValueError(f"unknown router {policy!r}; choose one of: {', '.join(ROUTERS)}")
        self.policy = policy
        self._turn = itertools.count()

    def pick(self, replicas: Sequence[Replica]) -> int:
        if self.policy == "round_robin":
            return next(self._turn) % len(replicas)
        loads = [r.engine.num_unfinished_requests for r in replicas]
        return loads.index(min(loads))


def simulate(
    replicas: Sequence[Replica],
    requests: Sequence[BenchRequest],
    router: Router | None = None,
    store: MetricsStore | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> MetricsStore:
    """Replay ``requests`` (arrival times in simulated seconds) on ``replicas``; return the metrics store.

    ``on_progress`` is called with the number of requests finished so far whenever it grows.
    """
    if not replicas:
        raise ValueError("need at least one replica")
    router = router or Router()
    store = store if store is not None else MetricsStore()
    for r in replicas:
        r.feeder = StoreFeeder(r.engine, store)
    pending = sorted(requests, key=lambda r: r.arrival_time)
    if any(not r.prompt_token_ids for r in pending):
        raise ValueError("every request needs prompt token ids (generate the workload with a token space)")
    next_i, idle, finished = 0, 0, 0
    while True:
        busy = [r for r in replicas if r.engine.has_unfinished_requests()]
        t_busy = min((r.clock.now() for r in busy), default=math.inf)
        t_arrival = pending[next_i].arrival_time if next_i < len(pending) else math.inf
        if t_arrival == math.inf and not busy:
            break
        if t_arrival <= t_busy:
            req = pending[next_i]
            replica = replicas[router.pick(replicas)]
            replica.clock.advance_to(req.arrival_time)
            replica.engine.add_request(
                req.request_id,
                list(req.prompt_token_ids),
                bench_params(req.num_output_tokens),
                req.arrival_time,
            )
            store.on_arrival(req.request_id, req.arrival_time, req.num_prompt_tokens, req.num_output_tokens)
            next_i += 1
            continue
        replica = min(busy, key=lambda r: r.clock.now())
        if replica.feeder.after_step(replica.engine.step()):
            idle = 0
        else:
            idle += 1
            if idle > _MAX_IDLE_STEPS:
                raise RuntimeError("the simulated engine stopped making progress with requests unfinished")
        done = sum(r.feeder.num_finished for r in replicas)
        if on_progress is not None and done > finished:
            on_progress(done)
        finished = done
    return store


def simulation_config(config: EngineConfig) -> EngineConfig:
    """``config`` with its model described by architecture only (``load_format="dummy"``, its HF config),
    so a simulated replica reads no checkpoint and no tokenizer; the KV pool keeps the size the real
    engine would get."""
    model = config.model
    if model.load_format == "dummy" and model.hf_config is not None:
        return config
    arch = resolve_model(model.model, model.load_format, model.hf_config).arch
    dummy = dataclasses.replace(model, model=None, load_format="dummy", hf_config=arch.to_hf_config())
    num_blocks = kv_blocks_for(config, arch)
    cache = dataclasses.replace(config.cache, num_kv_blocks=num_blocks)
    return dataclasses.replace(config, model=dummy, cache=cache)


def simulate_one(
    sim_config: EngineConfig,
    model: LatencyModel,
    workload: WorkloadConfig,
    num_replicas: int = 1,
    router: str = "round_robin",
    progress: bool = False,
    desc: str | None = None,
):
    """Simulate ``workload`` on ``num_replicas`` engines of ``sim_config``; returns the metrics store."""
    replicas = [make_replica(sim_config, copy.deepcopy(model)) for _ in range(num_replicas)]
    requests = generate_workload(workload, TokenSpace.of_engine(replicas[0].engine))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(requests), desc=desc, unit="req", leave=False)
    try:
        store = simulate(
            replicas,
            requests,
            Router(router),
            on_progress=(lambda n: bar.update(n - bar.n)) if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    return store
