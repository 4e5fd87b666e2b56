"""Entry point of a worker process (``mp`` executor): join the process group, load the shard, run steps.

Steps arrive pickled on a ZeroMQ PULL socket, in order. Tensor-parallel rank 0 of every stage reports
its ``StageTiming``; the last stage's rank 0 also sends the ``StepOutput``. A worker exits when told to,
when its parent (the engine) disappears, or after reporting a failure.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import zmq

from sarathi.config import EngineConfig
from sarathi.engine.step_messages import StageTiming, StepOutput
from sarathi.model.parallel import ShardSpec, init_distributed, threads_per_rank

_PARENT_CHECK_MS = 1000


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker process needs to start (plain data)."""

    config: EngineConfig
    shard: ShardSpec
    num_kv_blocks: int
    eos_token_ids: tuple[int, ...]
    init_method: str
    step_address: str
    result_address: str


@dataclass(frozen=True)
class WorkerReady:
    """A worker loaded its shard."""

    rank: int


@dataclass(frozen=True)
class StageDone:
    """A rank's part of a step is done: when it ran, and (from the last stage) the step's output."""

    timing: StageTiming
    output: StepOutput | None


@dataclass(frozen=True)
class WorkerError:
    """A worker failed (to start, or while running a step) and is exiting."""

    rank: int
    message: str


@dataclass(frozen=True)
class StopWorker:
    """Finish and exit."""


def describe_rank(shard: ShardSpec) -> str:
    """'rank 3 (pipeline stage 1, tensor-parallel rank 1)'."""
    return f"rank {shard.rank} (pipeline stage {shard.pp_rank}, tensor-parallel rank {shard.tp_rank})"


def _exit_with_parent(parent: int) -> None:
    """Exit the process as soon as the engine is gone, even while blocked in a collective or a receive
    that will never complete (a peer died)."""
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_MS / 1000)
    os._exit(1)


def run_worker(spec: WorkerSpec) -> None:
    """Process target: serve steps until stopped; failures are reported, then the process exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the process group; the engine decides
    import torch

    from sarathi.worker.worker import Worker

    torch.set_num_threads(threads_per_rank(spec.shard.world_size))
    context = zmq.Context()
    steps = context.socket(zmq.PULL)
    steps.connect(spec.step_address)
    results = context.socket(zmq.PUSH)
    results.connect(spec.result_address)
    rank = spec.shard.rank
    reports = spec.shard.tp_rank == 0
    parent = os.getppid()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    try:
        parallel = init_distributed(spec.shard, spec.init_method)
        worker = Worker(spec.config, spec.num_kv_blocks, spec.eos_token_ids, spec.shard, parallel)
        results.send_pyobj(WorkerReady(rank))
        while True:
            step = steps.recv_pyobj()
            if isinstance(step, StopWorker):
                break
            output, timing = worker.execute(step)
            if reports:
                results.send_pyobj(StageDone(timing, output))
        parallel.destroy()
    except Exception as e:
        traceback.print_exc()
        results.send_pyobj(WorkerError(rank, f"{describe_rank(spec.shard)}: {type(e).__name__}: {e}"))
    finally:
        results.close(linger=2000)
        steps.close(linger=0)
        context.term()
