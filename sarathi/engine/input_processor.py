"""The one place a request is checked before an engine takes it (``SamplingParams`` checks its own
ranges): ``LLM`` and the API process build ``EngineRequest``s here, and ``LLMEngine.add_request`` checks
only what depends on the engine's state. Every refusal is an ``InvalidRequestError`` naming the field."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sarathi.sampling_params import InvalidRequestError, SamplingParams
from sarathi.structured_output import ConstraintError, StructuredOutput, StructuredOutputLimits, check_bounds
from sarathi.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineRequest:
    """A checked request: its prompt's token ids and its sampling parameters (one sequence)."""

    prompt_token_ids: list[int]
    sampling_params: SamplingParams


@dataclass(frozen=True)
class InputProcessor:
    """Checks requests against one model: token ids in the vocabulary, a tokenizer for text and structured
    outputs, a structured output within ``constraint_limits`` (None: unbounded) and compiling with
    ``compile_constraint`` (None: compiled elsewhere, e.g. by the API process's checker subprocess)."""

    vocab_size: int
    tokenizer: Tokenizer | None = None
    constraint_limits: StructuredOutputLimits | None = None
    compile_constraint: Callable[[StructuredOutput], None] | None = None  # raises ConstraintError

    def process(self, prompt: str | list[int], params: SamplingParams) -> EngineRequest:
        """``prompt`` and ``params`` (one sequence: no ``n`` or ``best_of``) as one engine request."""
        if params.num_sequences > 1:
            raise InvalidRequestError(
                f"n={params.n}, best_of={params.best_of}: the engine runs one sequence per request; "
                "fan it out with sarathi.parallel_sampling.child_params (LLM.generate and the server do)",
                "n",
            )
        return EngineRequest(self.prompt_token_ids(prompt), self.check_params(params))

    def prompt_token_ids(self, prompt: str | list[int], param: str = "prompt") -> list[int]:
        """The prompt's token ids (a text prompt is tokenized)."""
        if not prompt:
            raise InvalidRequestError(f"{param}: the prompt is empty", param, "empty_prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError(f"{param}: this model has no tokenizer; pass token ids", param)
            return self.tokenizer.encode(prompt)
        vocab = self.vocab_size
        if bad := [t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]:
            raise InvalidRequestError(
                f"{param} token ids must be integers in [0, {vocab}), got {bad[:5]}",
                param,
                "invalid_token_id",
            )
        return list(prompt)

    def check_params(self, params: SamplingParams) -> SamplingParams:
        """``params`` if its token ids are in the vocabulary and its structured output is usable."""
        vocab, bias_ids = self.vocab_size, [t for t, _ in params.logit_bias]
        for param, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", bias_ids)):
            if bad := [t for t in ids if t >= vocab]:
                raise InvalidRequestError(f"{param} must be token ids in [0, {vocab}), got {bad[:5]}", param)
        if params.structured_output is not None:
            self.check_constraint(params.structured_output)
        return params

    def check_constraint(self, constraint: StructuredOutput) -> StructuredOutput:
        """``constraint`` if within the bounds and compiling; the error names ``constraint.source``."""
        if self.tokenizer is None:
            param = constraint.source or "structured_output"
            raise InvalidRequestError(f"{param}: this model has no tokenizer", param, "unsupported")
        try:
            if self.constraint_limits is not None:
                check_bounds(constraint, self.constraint_limits)
            if self.compile_constraint is not None:
                self.compile_constraint(constraint)
        except ConstraintError as e:
            raise constraint_refused(constraint, e) from None
        return constraint


def constraint_refused(constraint: StructuredOutput, error: ConstraintError) -> InvalidRequestError:
    """``error`` (over a bound, or not compiling) as the refusal naming ``constraint.source``."""
    param = constraint.source or "structured_output"
    return InvalidRequestError(f"{param}: {error}", param, "invalid_structured_output")
