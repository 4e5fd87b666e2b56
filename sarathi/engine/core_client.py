"""The API process's handle on the engine-core process: start it, send requests, stream their tokens back.

One asyncio task receives ``CoreOutputs`` and routes each ``RequestOutput`` to its request's queue; a
watchdog notices when the engine-core process dies and ends every in-flight request with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from sarathi.config import EngineConfig
from sarathi.engine.core_messages import (
    AbortRequests,
    AddRequest,
    CoreOutputs,
    EngineFailed,
    EngineReady,
    Rejection,
    Shutdown,
)
from sarathi.engine.input_processor import EngineRequest
from sarathi.engine.llm_engine import LLMEngine
from sarathi.outputs import RequestOutput

_WATCHDOG_INTERVAL_S = 0.1
# The engine core sends a heartbeat every 0.5 s when idle and a message per iteration when busy; an
# iteration on a slow CPU can take seconds, so only a long silence counts as unhealthy.
_SILENCE_LIMIT_S = 60.0


class EngineDeadError(RuntimeError):
    """The engine-core process is gone; requests cannot complete."""


class RequestRejectedError(ValueError):
    """The engine refused a request; ``rejection`` says why (its reason, and the field at fault)."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


@dataclass
class _Pending:
    accepted: asyncio.Future
    outputs: asyncio.Queue


class RequestStream:
    """The outputs of one request, in order; ends after the one with ``finished`` set."""

    def __init__(self, request_id: str, queue: asyncio.Queue, on_close: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._queue = queue
        self._on_close = on_close
        self._get: asyncio.Future | None = None
        self.finished = False

    async def next(self, timeout: float | None = None) -> RequestOutput | None:
        """The next output, or None if none came within ``timeout`` seconds; raises EngineDeadError."""
        # A get that timed out stays pending for the next call: cancelling it could drop a delta.
        if self._get is None:
            self._get = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({self._get}, timeout=timeout)
        if not done:
            return None
        item, self._get = self._get.result(), None
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def close(self) -> None:
        """Abort the request if it has not finished (a client went away); safe to call twice."""
        if self._get is not None:
            self._get.cancel()
            self._get = None
        self._on_close(self.request_id)


class EngineCoreClient:
    """Starts the engine-core process and talks to it over two ZeroMQ PUSH/PULL pairs."""

    def __init__(
        self,
        config: EngineConfig,
        build: Callable[[EngineConfig], LLMEngine],
        max_waiting: int,
        restart_on_failure: bool = False,
    ) -> None:
        self.config = config
        self.build = build
        self.max_waiting = max_waiting
        self.restart_on_failure = restart_on_failure
        self.ready: EngineReady | None = None
        self.dead_reason: str | None = None
        self.on_outputs: Callable[[CoreOutputs], None] | None = None
        self._pending: dict[str, _Pending] = {}
        self._last_message = time.monotonic()
        self._tasks: list[asyncio.Task] = []
        self._dir = tempfile.TemporaryDirectory(prefix="sarathi-")
        self._context = zmq.asyncio.Context()
        self._sync_context = zmq.Context()
        # Sends are synchronous so that an abort can be sent from any cleanup path; with no high-water
        # mark they only queue, never block the event loop.
        self._in = self._sync_context.socket(zmq.PUSH)  # to the engine core
        self._in.setsockopt(zmq.SNDHWM, 0)
        self._out = self._context.socket(zmq.PULL)  # from the engine core
        self._in.bind(f"ipc://{os.path.join(self._dir.name, 'in')}")
        self._out.bind(f"ipc://{os.path.join(self._dir.name, 'out')}")
        self._process: multiprocessing.Process | None = None
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 600.0) -> EngineReady:
        """Spawn the engine core and wait until its model is loaded. Raises RuntimeError if it fails."""
        from sarathi.engine.engine_core import run_engine_core  # the model stack loads in the child only

        ctx = multiprocessing.get_context("spawn")
        self._process = ctx.Process(
            target=run_engine_core,
            args=(
                self.config,
                self._in.getsockopt_string(zmq.LAST_ENDPOINT),
                self._out.getsockopt_string(zmq.LAST_ENDPOINT),
                self.max_waiting,
                self.build,
            ),
            name="sarathi-engine-core",
            # Not a daemon: it starts worker processes of its own. It exits when the API process goes.
            daemon=False,
        )
        self._process.start()
        deadline = time.monotonic() + timeout_s
        while True:
            if await self._out.poll(200):
                message = await self._out.recv_pyobj()
                if isinstance(message, EngineReady):
                    break
                if isinstance(message, EngineFailed):
                    self._process.join(5)
                    raise RuntimeError(f"engine core failed to start: {message.message}")
            if not self._process.is_alive():
                raise RuntimeError(f"engine core exited during startup (exit code {self._process.exitcode})")
            if time.monotonic() > deadline:
                self._process.kill()
                raise RuntimeError(f"engine core did not start within {timeout_s:.0f} s")
        self.ready = message
        self._last_message = time.monotonic()
        self._tasks = [asyncio.create_task(self._receive_loop()), asyncio.create_task(self._watchdog())]
        return message

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine core (abandoning whatever it still runs) and wait for the process to exit.

        Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        process = self._process
        if process is not None and process.is_alive():
            with contextlib.suppress(zmq.ZMQError):
                self._in.send_pyobj(Shutdown(), zmq.NOBLOCK)
            deadline = time.monotonic() + timeout_s
            while process.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        self._fail_all(EngineDeadError("the server is shutting down"))
        self._in.close(linger=0)
        self._out.close(linger=0)
        self._context.term()
        self._sync_context.term()
        self._dir.cleanup()

    @property
    def is_healthy(self) -> bool:
        return (
            self.dead_reason is None
            and self._process is not None
            and self._process.is_alive()
            and time.monotonic() - self._last_message < _SILENCE_LIMIT_S
        )

    @property
    def num_in_flight(self) -> int:
        return len(self._pending)

    # --- requests -------------------------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        request: EngineRequest,
        arrival_time: float,
        after: str | None = None,
    ) -> RequestStream:
        """Send a request and wait until the engine accepts it; raises RequestRejectedError or
        EngineDeadError. ``after``: a sibling choice whose prefill it waits for."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if request_id in self._pending:
            raise ValueError(f"request id {request_id!r} is already in use")
        loop = asyncio.get_running_loop()
        pending = _Pending(loop.create_future(), asyncio.Queue())
        self._pending[request_id] = pending
        self._in.send_pyobj(AddRequest(request_id, request, arrival_time, after))
        try:
            await pending.accepted
        except BaseException:
            self._pending.pop(request_id, None)
            raise
        return RequestStream(request_id, pending.outputs, self.abort)

    def abort(self, request_id: str) -> None:
        """Abort a request that is still in flight (no-op for finished ones)."""
        if self._pending.pop(request_id, None) is not None and self.dead_reason is None:
            with contextlib.suppress(zmq.ZMQError):
                self._in.send_pyobj(AbortRequests([request_id]), zmq.NOBLOCK)

    # --- background tasks -----------------------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        while True:
            message = await self._out.recv_pyobj()
            self._last_message = time.monotonic()
            if isinstance(message, EngineFailed):
                self._die(f"engine core failed: {message.message}")
                return
            self._route(message)

    def _route(self, out: CoreOutputs) -> None:
        for request_id in out.accepted:
            pending = self._pending.get(request_id)
            if pending is not None and not pending.accepted.done():
                pending.accepted.set_result(None)
        for rejection in out.rejected:
            self._reject(rejection)
        for output in out.outputs:
            pending = self._pending.get(output.request_id)
            if pending is None:
                continue  # aborted by the client meanwhile
            pending.outputs.put_nowait(output)
            if output.finished:
                del self._pending[output.request_id]
        if self.on_outputs is not None:
            self.on_outputs(out)

    def _reject(self, rejection: Rejection) -> None:
        pending = self._pending.pop(rejection.request_id, None)
        if pending is not None and not pending.accepted.done():
            pending.accepted.set_exception(RequestRejectedError(rejection))

    async def _watchdog(self) -> None:
        # Runs until the process is gone, also after an EngineFailed message: is_alive() reaps the exited
        # child, so a crashed engine core never lingers as a zombie.
        while self._process is not None and self._process.is_alive():
            await asyncio.sleep(_WATCHDOG_INTERVAL_S)
        if self.dead_reason is None:
            self._die(f"engine core process exited (exit code {self._process.exitcode})")
        if self.restart_on_failure and not self._closed:
            await self._restart()

    async def _restart(self) -> None:
        """Start a fresh engine core after a crash; requests in flight have already failed. /health is
        503 until the new one is ready."""
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        print(f"sarathi serve: restarting the engine core ({self.dead_reason})", flush=True)
        try:
            ready = await self.start()
        except RuntimeError as e:
            print(f"sarathi serve: the engine core could not be restarted: {e}", flush=True)
            return
        self.dead_reason = None
        print(f"sarathi serve: engine core restarted (pid {ready.pid})", flush=True)

    def _die(self, reason: str) -> None:
        self.dead_reason = reason
        self._fail_all(EngineDeadError(reason))

    def _fail_all(self, error: Exception) -> None:
        for pending in self._pending.values():
            if not pending.accepted.done():
                pending.accepted.set_exception(error)
            else:
                pending.outputs.put_nowait(error)
        self._pending.clear()
