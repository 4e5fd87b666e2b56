"""Typed messages between the API server process and the engine-core process (pickled over ZeroMQ).

Pure Python (no torch): the API process works with these without loading the model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sarathi.config import EngineConfig
from sarathi.engine.input_processor import EngineRequest
from sarathi.outputs import IterationStats, RequestOutput

# --- API process -> engine core -------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    """Queue a request the API process has checked (``InputProcessor``). ``arrival_time`` is on the shared
    ``time.monotonic`` clock; ``after``: a sibling choice whose prefill this one waits for."""

    request_id: str
    request: EngineRequest
    arrival_time: float
    after: str | None = None


@dataclass(frozen=True)
class AbortRequests:
    """Stop these requests and free their KV blocks (unknown or finished ids are ignored)."""

    request_ids: list[str]


@dataclass(frozen=True)
class Shutdown:
    """Abort everything still running and exit."""


# --- engine core -> API process -------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineReady:
    """Sent once the model and the KV cache are loaded."""

    pid: int
    config: EngineConfig
    tokenizer_dir: str | None
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int
    worker_pids: list[int] = field(default_factory=list)  # worker processes of the engine core, if any
    eos_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineFailed:
    """The engine core could not start or crashed; it exits after sending this."""

    message: str


class RejectReason(enum.Enum):
    """Why the engine core refused a request."""

    INVALID = "invalid"  # it can never run on this engine (e.g. too large for the KV cache)
    OVERLOADED = "overloaded"  # the waiting queue is full: retry later
    INTERNAL = "internal"  # accepting it raised an unexpected error (a server bug, not bad input)


@dataclass(frozen=True)
class Rejection:
    """A request the engine refused; ``param`` names the request field at fault, if one is."""

    request_id: str
    message: str
    reason: RejectReason = RejectReason.INVALID
    param: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class EngineSnapshot:
    """Queue and cache occupancy after the latest iteration."""

    num_waiting: int
    num_running: int
    num_preempted: int
    num_kv_blocks_used: int
    num_kv_blocks_total: int


@dataclass(frozen=True)
class CoreOutputs:
    """Everything that happened in one pass of the engine-core loop, sent as one message.

    Sent after every iteration, after handling inputs while idle, and as a heartbeat otherwise.
    """

    accepted: list[str] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)
    iterations: list[IterationStats] = field(default_factory=list)
    snapshot: EngineSnapshot | None = None
