"""What every endpoint of the API process shares."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sarathi.engine.core_client import EngineCoreClient
from sarathi.engine.input_processor import InputProcessor
from sarathi.entrypoints.openai.constraint_checker import ConstraintChecker
from sarathi.entrypoints.openai.guards import RequestLimits
from sarathi.entrypoints.openai.server_metrics import ServerMetrics
from sarathi.structured_output import StructuredOutputLimits
from sarathi.tokenizer import Tokenizer


@dataclass
class ServerState:
    """What the endpoints share: the engine-core client, the tokenizer and the metrics."""

    client: EngineCoreClient
    model_name: str
    tokenizer: Tokenizer | None
    metrics: ServerMetrics
    created: int
    limits: RequestLimits = field(default_factory=RequestLimits)
    constraint_limits: StructuredOutputLimits = field(default_factory=StructuredOutputLimits)
    constraints: ConstraintChecker | None = None  # compiles structured outputs (None: model has no tokenizer)
    tool_call_parser: str | None = "hermes"  # chosen from the chat template, or --tool-call-parser
    enable_auto_tool_choice: bool = True  # --no-enable-auto-tool-choice turns tool_choice "auto" off

    @property
    def processor(self) -> InputProcessor:
        """Checks requests for the engine core; structured outputs are compiled by ``constraints``."""
        return InputProcessor(self.client.ready.vocab_size, self.tokenizer, self.constraint_limits)

    @property
    def max_model_len(self) -> int:
        return self.client.ready.max_model_len

    def effective_config(self, api_key_required: bool) -> dict:
        """What the server runs with (printed at start-up and answered by ``GET /server_info``): the current
        engine core's process ids, KV cache and engine config, and the API process's limits."""
        ready = self.client.ready
        return {
            "served_model_name": self.model_name,
            "engine_core_pid": ready.pid,
            "worker_pids": ready.worker_pids,
            "max_model_len": ready.max_model_len,
            "num_kv_blocks": ready.num_kv_blocks,
            "block_size": ready.block_size,
            "max_waiting": self.client.max_waiting,
            "limits": dataclasses.asdict(self.limits),
            "structured_output_limits": dataclasses.asdict(self.constraint_limits),
            "api_key_required": api_key_required,
            **dataclasses.asdict(ready.config),
        }
