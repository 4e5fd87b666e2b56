"""``mp``: one worker process per rank on this machine, tensor x pipeline parallel over torch.distributed.

Every step is pickled once and pushed to every worker; the last stage's tensor-parallel rank 0 answers
with the sampled tokens. The engine keeps up to ``pipeline_parallel_size`` steps in flight. A worker that
dies, raises or stays silent past ``step_timeout_s`` raises ``WorkerFailedError`` naming its rank.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from sarathi.config import EngineConfig
from sarathi.engine.executor_base import Executor, WorkerFailedError
from sarathi.engine.step_messages import StageTiming, StepInput, StepOutput
from sarathi.model.parallel import shards_of
from sarathi.net import free_port
from sarathi.worker.process import StageDone, StopWorker, WorkerError, WorkerReady, WorkerSpec, describe_rank

_POLL_MS = 200
STEP_TIMEOUT_S = float(os.environ.get("SARATHI_STEP_TIMEOUT_S", "600"))
STARTUP_TIMEOUT_S = 600.0


class MultiprocExecutor(Executor):
    """Worker processes on this machine, talking to the engine over ZeroMQ (steps) and gloo (tensors)."""

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
        self._dir = tempfile.TemporaryDirectory(prefix="sarathi-workers-")
        self._context = zmq.Context()
        self._results = self._context.socket(zmq.PULL)
        self._results.bind(f"ipc://{os.path.join(self._dir.name, 'results')}")
        result_address = self._results.getsockopt_string(zmq.LAST_ENDPOINT)
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self._steps: list[zmq.Socket] = []
        self._processes: list[subprocess.Popen] = []
        self._pending: collections.deque[int] = collections.deque()
        self._outputs: dict[int, StepOutput] = {}
        self._timings: list[StageTiming] = []
        self._closed = False
        atexit.register(self.shutdown)
        try:
            for shard in self.shards:
                sock = self._context.socket(zmq.PUSH)
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.bind(f"ipc://{os.path.join(self._dir.name, f'steps-{shard.rank}')}")
                self._steps.append(sock)
                spec = WorkerSpec(
                    config,
                    shard,
                    num_kv_blocks,
                    eos_token_ids,
                    init_method,
                    sock.getsockopt_string(zmq.LAST_ENDPOINT),
                    result_address,
                )
                self._processes.append(_start_worker(spec))
            self._wait_ready()
        except BaseException:
            self.shutdown()
            raise

    def _wait_ready(self) -> None:
        ready: set[int] = set()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(ready) < len(self.shards):
            message = self._receive(deadline, "to load its shard")
            if isinstance(message, WorkerReady):
                ready.add(message.rank)

    # --- steps ----------------------------------------------------------------------------------------------
    def submit(self, step: StepInput) -> None:
        self.check_health()
        payload = pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)
        for sock in self._steps:
            sock.send(payload)
        self._pending.append(step.step_id)

    def collect(self) -> StepOutput:
        step_id = self._pending[0]
        deadline = time.monotonic() + self.step_timeout_s
        while step_id not in self._outputs:
            self._receive(deadline, f"to finish step {step_id}")
        self._pending.popleft()
        return self._outputs.pop(step_id)

    def _receive(self, deadline: float, doing: str) -> object:
        """Wait for one message from the workers; raise WorkerFailedError on a failure or a timeout."""
        while not self._results.poll(_POLL_MS):
            self.check_health()
            if time.monotonic() > deadline:
                raise WorkerFailedError(f"a worker took too long {doing} (limit {self.step_timeout_s:.0f} s)")
        message = self._results.recv_pyobj()
        if isinstance(message, WorkerError):
            # A peer that died makes the others fail in their next collective or send: name the dead one.
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                self.check_health(exclude_rank=message.rank)
                time.sleep(0.05)
            raise WorkerFailedError(f"worker {message.message}")
        if isinstance(message, StageDone):
            self._timings.append(message.timing)
            if message.output is not None:
                self._outputs[message.output.step_id] = message.output
        return message

    def drain_timings(self) -> list[StageTiming]:
        timings, self._timings = self._timings, []
        return timings

    def check_health(self, exclude_rank: int | None = None) -> None:
        for shard, process in zip(self.shards, self._processes, strict=False):
            if shard.rank != exclude_rank and process.poll() is not None:
                raise WorkerFailedError(
                    f"worker {describe_rank(shard)} (pid {process.pid}) exited with code {process.returncode}"
                )

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        for sock in self._steps:
            with contextlib.suppress(zmq.ZMQError):
                sock.send_pyobj(StopWorker(), zmq.NOBLOCK)
        deadline = time.monotonic() + 5
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        for process in self._processes:
            if process.poll() is None:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
        for sock in self._steps:
            sock.close(linger=0)
        self._results.close(linger=0)
        self._context.term()
        self._dir.cleanup()


def _start_worker(spec: WorkerSpec) -> subprocess.Popen:
    """``python -m sarathi.worker`` with ``spec`` on its stdin: a fresh interpreter that imports only
    sarathi, never the main script of this process (see sarathi/worker/__main__.py)."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the sarathi package
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        # -P: the working directory does not go first on sys.path, where a stray file could shadow a library.
        [sys.executable, "-P", "-m", "sarathi.worker"],
        stdin=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
    )
    with process.stdin:
        process.stdin.write(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    return process
