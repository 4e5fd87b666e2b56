"""The engine-core process: owns the scheduler, KV cache and model, and runs the iteration loop.

It pulls ``AddRequest`` / ``AbortRequests`` / ``Shutdown`` messages from the API process and pushes one
``CoreOutputs`` message per loop pass: every request's new tokens of that iteration, accepted and rejected
requests, iteration stats and a queue/cache snapshot.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import time
import traceback
from collections.abc import Callable

import zmq

from sarathi.config import EngineConfig
from sarathi.engine.core_messages import (
    AbortRequests,
    AddRequest,
    CoreOutputs,
    EngineFailed,
    EngineReady,
    Rejection,
    RejectReason,
    Shutdown,
)
from sarathi.engine.llm_engine import LLMEngine
from sarathi.sampling_params import InvalidRequestError

HEARTBEAT_INTERVAL_S = 0.5


class EngineCore:
    """The loop around an ``LLMEngine`` that serves requests arriving over ZeroMQ."""

    def __init__(self, engine: LLMEngine, inputs: zmq.Socket, outputs: zmq.Socket, max_waiting: int) -> None:
        self.engine = engine
        self.inputs = inputs
        self.outputs = outputs
        self.max_waiting = max_waiting
        self._parent_pid = os.getppid()

    def run(self) -> None:
        last_sent = 0.0
        while os.getppid() == self._parent_pid:  # the API process died: do not outlive it
            busy = self.engine.has_unfinished_requests()
            out = CoreOutputs()
            messages = self._receive(timeout_ms=0 if busy else int(HEARTBEAT_INTERVAL_S * 1000))
            if any(isinstance(m, Shutdown) for m in messages):
                return
            for message in messages:
                self._handle(message, out)
            # A dead worker fails the engine (which stops the others) on this pass: not only when a step
            # is collected, which may not happen while nothing is scheduled or no request arrives.
            self.engine.check_health()
            if self.engine.has_unfinished_requests():
                result = self.engine.step()
                out.outputs.extend(result.outputs)
                if result.iteration is not None:
                    out.iterations.append(result.iteration)
            now = time.monotonic()
            if messages or out.outputs or out.iterations or now - last_sent >= HEARTBEAT_INTERVAL_S:
                self.outputs.send_pyobj(dataclasses.replace(out, snapshot=self.engine.snapshot()))
                last_sent = now

    def _receive(self, timeout_ms: int) -> list[object]:
        messages = []
        if self.inputs.poll(timeout_ms):
            while True:
                try:
                    messages.append(self.inputs.recv_pyobj(zmq.NOBLOCK))
                except zmq.Again:
                    break
        return messages

    def _handle(self, message: object, out: CoreOutputs) -> None:
        if isinstance(message, AddRequest):
            m = message
            if self.engine.num_waiting >= self.max_waiting:
                full = f"the waiting queue is full ({self.max_waiting})"
                out.rejected.append(Rejection(m.request_id, full, RejectReason.OVERLOADED))
                return
            try:  # checked by the API process: only what depends on the engine's state can fail here
                self.engine.add_request(m.request_id, m.request, arrival_time=m.arrival_time, after=m.after)
            except InvalidRequestError as e:
                out.rejected.append(Rejection(m.request_id, e.message, param=e.param, code=e.code))
            except Exception as e:  # a bug, not bad input: refuse this request, keep serving the others
                traceback.print_exc()
                error = f"internal error: {type(e).__name__}: {e}"
                out.rejected.append(Rejection(m.request_id, error, RejectReason.INTERNAL))
            else:
                out.accepted.append(m.request_id)
        elif isinstance(message, AbortRequests):
            for request_id in message.request_ids:
                self.engine.abort_request(request_id)
        else:
            raise TypeError(f"unexpected message {type(message).__name__}")


def run_engine_core(
    config: EngineConfig,
    input_address: str,
    output_address: str,
    max_waiting: int,
    build: Callable[[EngineConfig], LLMEngine],
) -> None:
    """Process entry point: build the engine with ``build`` (a module-level function, so that it pickles by
    name), report ready (or why not), then serve until told to stop."""
    # Ctrl-C reaches the whole process group; the API process decides when the engine core stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    inputs.connect(input_address)
    outputs = context.socket(zmq.PUSH)
    outputs.connect(output_address)
    engine = None
    try:
        engine = build(config)
        outputs.send_pyobj(
            EngineReady(
                pid=os.getpid(),
                config=config,
                tokenizer_dir=engine.model.tokenizer_dir,
                max_model_len=engine.max_model_len,
                vocab_size=engine.model.vocab_size,
                num_kv_blocks=engine.num_kv_blocks,
                block_size=config.cache.block_size,
                worker_pids=engine.worker_pids,
                eos_token_ids=engine.eos_token_ids,
            )
        )
        # The start-up heap (torch, the model, the tokenizer) never becomes garbage: out of the collector's
        # sight, the first full collection no longer stalls every running stream (~150 ms, once).
        gc.collect()
        gc.freeze()
        EngineCore(engine, inputs, outputs, max_waiting).run()
    except Exception as e:
        traceback.print_exc()
        outputs.send_pyobj(EngineFailed(f"{type(e).__name__}: {e}"))
    finally:
        if engine is not None:
            engine.shutdown()
        outputs.close(linger=1000)
        inputs.close(linger=0)
        context.term()
