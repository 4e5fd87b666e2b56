"""``ray``: one Ray actor per rank, on one or several nodes, tensor x pipeline parallel (torch.distributed).

The ranks are placed with a placement group (one bundle per rank, PACK: fill a node, then span nodes) and
join a gloo process group at rank 0's node. Every step is put in the object store once and passed to every
actor; an actor runs its calls one at a time in submission order, so up to ``pipeline_parallel_size`` steps
can be queued. An actor that dies, raises or stays silent past ``step_timeout_s`` raises
``WorkerFailedError`` naming its rank.

Ray is joined if it is initialized or ``RAY_ADDRESS`` names a cluster (``ray start --head`` on one node,
``ray start --address=HEAD:6379`` on the others); otherwise a local instance is started on 127.0.0.1.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterator
from typing import Any

try:
    import ray
    import ray.exceptions
except ImportError as e:
    raise ImportError("the ray executor backend needs Ray: pip install 'sarathi[ray]'") from e
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from sarathi.config import EngineConfig
from sarathi.engine.executor_base import Executor, WorkerFailedError
from sarathi.engine.step_messages import StageTiming, StepInput, StepOutput
from sarathi.executor.multiproc import STARTUP_TIMEOUT_S, STEP_TIMEOUT_S
from sarathi.model.parallel import ShardSpec, init_distributed, shards_of, threads_per_rank
from sarathi.net import free_port
from sarathi.worker.process import describe_rank

PLACEMENT_TIMEOUT_S = float(os.environ.get("SARATHI_RAY_PLACEMENT_TIMEOUT_S", "60"))
LOCAL_OBJECT_STORE_BYTES = 160 * 1024**2
_PING_INTERVAL_S = 1.0


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray maps 127.0.0.1 to the machine's routable address and then serves on every interface, unless
    clusters are disabled (its macOS default): disable them while a single-node instance starts. Usage
    statistics (sent to ray.io) are off unless RAY_USAGE_STATS_ENABLED says otherwise."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    set_usage = "RAY_USAGE_STATS_ENABLED" not in os.environ
    ray_constants.ENABLE_RAY_CLUSTER = False
    if set_usage:
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if set_usage:
            os.environ.pop("RAY_USAGE_STATS_ENABLED", None)


def start_local_ray(num_cpus: int | None = None) -> None:
    """Start a single-node Ray instance on 127.0.0.1: no dashboard, a small object store."""
    with _loopback_only():
        ray.init(
            address="local",  # not RAY_ADDRESS
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            _node_ip_address="127.0.0.1",
        )


def connect_ray() -> bool:
    """Use the Ray instance this process is connected to, else the cluster at ``RAY_ADDRESS``, else start
    a local one. True if this call connected (and so ``ray.shutdown()`` is ours to call)."""
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        start_local_ray()
    return True


class RayWorker:
    """The actor behind one rank: a ``Worker`` once ``start`` has joined the process group."""

    def __init__(
        self, config: EngineConfig, shard: ShardSpec, num_kv_blocks: int, eos_ids: tuple[int, ...]
    ) -> None:
        self.config, self.shard, self.num_kv_blocks, self.eos_ids = config, shard, num_kv_blocks, eos_ids
        self.worker = None

    def node(self) -> tuple[int, str, str]:
        """(pid, Ray node id, node IP address)."""
        return os.getpid(), ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        """A TCP port free on this node's address (for the process group's rendezvous)."""
        return free_port(ray.util.get_node_ip_address())

    def clock(self) -> float:
        return time.monotonic()

    def start(self, init_method: str, ranks_on_node: int) -> None:
        """Join the process group and load this rank's shard."""
        import torch

        from sarathi.worker.worker import Worker

        torch.set_num_threads(threads_per_rank(ranks_on_node))
        parallel = init_distributed(self.shard, init_method)
        self.worker = Worker(self.config, self.num_kv_blocks, self.eos_ids, self.shard, parallel)

    def execute(self, step: StepInput) -> tuple[StepOutput | None, StageTiming]:
        return self.worker.execute(step)

    def ping(self) -> None:
        pass


_RemoteWorker = ray.remote(max_restarts=0, max_task_retries=0)(RayWorker)


class RayExecutor(Executor):
    """Ray actors, one per rank, on the nodes of a Ray cluster (or of a local instance)."""

    def __init__(
        self,
        config: EngineConfig,
        num_kv_blocks: int,
        eos_token_ids: tuple[int, ...],
        step_timeout_s: float = STEP_TIMEOUT_S,
    ) -> None:
        self.max_in_flight = config.parallel.pipeline_parallel_size
        self.step_timeout_s = step_timeout_s
        self.shards = shards_of(config)
        self.actors: list[ActorHandle] = []
        self._pending: collections.deque[list[ObjectRef]] = collections.deque()  # per step, a ref per rank
        self._pings: list[ObjectRef] = []
        self._last_ping = 0.0
        self._timings: list[StageTiming] = []
        self._clock_offsets: dict[int, float] = {}
        self._pids: list[int] = []
        self._pg: PlacementGroup | None = None
        self._closed = False
        self._owns_ray = connect_ray()
        atexit.register(self.shutdown)
        try:
            self._pg, cpus = self._place()
            for shard in self.shards:
                strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=shard.rank)
                actor = _RemoteWorker.options(num_cpus=cpus, scheduling_strategy=strategy)
                self.actors.append(actor.remote(config, shard, num_kv_blocks, eos_token_ids))
            self._start()
        except BaseException:
            self.shutdown()
            raise

    def _place(self) -> tuple[PlacementGroup, float]:
        """Reserve one bundle per rank: a whole CPU each if the cluster has enough free, else a share."""
        world = len(self.shards)
        available = ray.available_resources().get("CPU", 0.0)
        cpus = 1.0 if available >= world else math.floor(available / world * 100) / 100
        asked = (
            f"{world} workers x {cpus:g} CPU asked, {available:g} CPUs free of "
            f"{ray.cluster_resources().get('CPU', 0):g} in the cluster"
        )
        if cpus <= 0:
            raise RuntimeError(f"the Ray cluster has too few free CPUs for the workers ({asked})")
        pg = placement_group([{"CPU": cpus}] * world, strategy="PACK")
        try:
            ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            raise RuntimeError(
                f"Ray could not place the workers within {PLACEMENT_TIMEOUT_S:.0f} s ({asked})"
            ) from None
        return pg, cpus

    def _start(self) -> None:
        """Find the actors' nodes, have every rank join the process group at rank 0's node, load shards."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        limit = f"(limit {STARTUP_TIMEOUT_S:.0f} s)"
        nodes = self._wait([a.node.remote() for a in self.actors], deadline, f"to start {limit}")
        here = ray.get_runtime_context().get_node_id()
        self._pids = [pid for pid, node, _ in nodes if node == here]
        ranks_on = collections.Counter(node for _, node, _ in nodes)
        port = self._wait([self.actors[0].free_port.remote()], deadline, f"to start {limit}", [0])[0]
        init_method = f"tcp://{nodes[0][2]}:{port}"
        starts = [
            a.start.remote(init_method, ranks_on[n]) for a, (_, n, _) in zip(self.actors, nodes, strict=True)
        ]
        self._wait(starts, deadline, f"to load its shard {limit}")
        # Stage timings are read on each actor's monotonic clock: shift those of other nodes onto ours.
        for shard, actor, (_, node, _) in zip(self.shards, self.actors, nodes, strict=True):
            if shard.tp_rank == 0 and node != here:
                before = time.monotonic()
                theirs = self._wait([actor.clock.remote()], deadline, f"to start {limit}", [shard.rank])[0]
                self._clock_offsets[shard.pp_rank] = (before + time.monotonic()) / 2 - theirs

    def _wait(
        self, refs: list[ObjectRef], deadline: float, doing: str, ranks: list[int] | None = None
    ) -> list:
        """The results of ``refs``, the calls of ``ranks`` (all, in order, by default); raise
        WorkerFailedError as soon as one fails, or at the deadline."""
        rank_of = dict(zip(refs, ranks or range(len(refs)), strict=True))
        remaining = list(refs)
        while remaining:
            ready, remaining = ray.wait(remaining, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                late = ", ".join(describe_rank(self.shards[rank_of[r]]) for r in remaining)
                raise WorkerFailedError(
                    f"{'worker' if len(remaining) == 1 else 'workers'} {late} took too long {doing}"
                )
            self._get(ready[0], rank_of[ready[0]])
        return [self._get(ref, rank_of[ref]) for ref in refs]

    def _get(self, ref: ObjectRef, rank: int) -> Any:
        """``ray.get(ref)`` (a finished ref), failures turned into WorkerFailedError naming the rank."""
        who = f"worker {describe_rank(self.shards[rank])}"
        try:
            return ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError as e:
            raise WorkerFailedError(f"{who} died: {' '.join(str(e).split())}") from e
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if e.cause is not None else e
            raise WorkerFailedError(f"{who}: {type(cause).__name__}: {cause}") from e
        except ray.exceptions.RayError as e:
            raise WorkerFailedError(f"{who}: {type(e).__name__}: {e}") from e

    # --- steps ----------------------------------------------------------------------------------------------
    def submit(self, step: StepInput) -> None:
        payload = ray.put(step)  # once, then passed by reference to every actor
        self._pending.append([a.execute.remote(payload) for a in self.actors])

    def collect(self) -> StepOutput:
        refs = self._pending.popleft()
        deadline = time.monotonic() + self.step_timeout_s
        results = self._wait(refs, deadline, f"to finish a step (limit {self.step_timeout_s:g} s)")
        output = None
        for shard, (out, timing) in zip(self.shards, results, strict=True):
            if shard.tp_rank == 0:
                offset = self._clock_offsets.get(shard.pp_rank, 0.0)
                self._timings.append(
                    dataclasses.replace(timing, start=timing.start + offset, end=timing.end + offset)
                )
                output = out if shard.is_last_stage else output
        return output

    def drain_timings(self) -> list[StageTiming]:
        timings, self._timings = self._timings, []
        return timings

    def check_health(self) -> None:
        """Raise if a call that already finished (of a step in flight, or the last ping) failed. Pings every
        actor now and then without waiting: a dead actor fails its ping by the next check."""
        pings_done = True
        for refs in [*self._pending, self._pings]:
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else [])
            for rank, ref in enumerate(refs):
                if ref in ready:
                    self._get(ref, rank)
            pings_done = len(ready) == len(refs)  # the last list checked is the pings
        now = time.monotonic()
        if pings_done and now - self._last_ping >= _PING_INTERVAL_S:
            self._pings = [a.ping.remote() for a in self.actors]
            self._last_ping = now

    @property
    def worker_pids(self) -> list[int]:
        """The actors' processes on this node (every actor's on a single machine)."""
        return list(self._pids)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        self._pending.clear()
        self._pings = []
        if not ray.is_initialized():  # someone shut Ray down already: the actors went with it
            return
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self._pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
        if self._owns_ray:
            ray.shutdown()
