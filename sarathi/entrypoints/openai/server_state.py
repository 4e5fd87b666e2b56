"""What every endpoint of the API process shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from sarathi.engine.core_client import EngineCoreClient
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
    def max_model_len(self) -> int:
        return self.client.ready.max_model_len
