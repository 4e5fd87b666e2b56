"""Request bodies of the OpenAI-compatible API (pydantic).

Fields that common clients send but we do not act on are accepted when they ask for the default
behaviour (e.g. ``best_of=1``, ``repetition_penalty=1``) and rejected with a 400 naming them otherwise
(the table is ``refusals.py``); other unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from sarathi.entrypoints.openai.errors import APIError
from sarathi.sampling_params import SamplingParams

MAX_BATCH_PROMPTS = 256  # prompts in one /v1/completions request
# Token ids: JSON booleans are not integers here (pydantic's lax mode would read true as 1).
TokenId = Annotated[StrictInt, Field(ge=0)]


def _unsupported(param: str, why: str) -> None:
    raise APIError(f"{param}: {why}", param=param, code="unsupported")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions. Their ranges are ``SamplingParams``' to check
    (its InvalidRequestError names the field); only what the API adds is bounded here."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: Annotated[float, Field(le=2.0)] | None = None  # OpenAI's bound; >= 0 is SamplingParams'
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    n: int = 1
    best_of: int | None = None
    prompt_logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_p: float | None = None
    user: str | None = None
    # Structured outputs: read by structured_requests.structured_output_of.
    response_format: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None

    def check_supported(self) -> None:
        """Raise APIError for options this server does not implement (default values pass)."""
        if self.stream_options is not None and not self.stream:
            _unsupported("stream_options", "only allowed when stream is true")
        if self.stream and self.best_of is not None and self.best_of > self.n:
            _unsupported("best_of", "best_of > n cannot be streamed (the best choices are known at the end)")

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def num_logprobs(self) -> int | None:
        """How many alternatives to return per token (None: no log probabilities)."""
        return None

    def sampling_params(self, max_tokens: int, temperature_default: float = 1.0) -> SamplingParams:
        """The engine's SamplingParams; ValueError names a bad field."""
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=temperature_default if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            seed=self.seed,
            stop=self.stop_strings(),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=self.num_logprobs(),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=self.logit_bias or {},
            min_p=self.min_p or 0.0,
            prompt_logprobs=self.num_prompt_logprobs(),
            n=self.n,
            best_of=self.best_of,
        )

    def num_prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token to compute (None: no prompt log probabilities)."""
        return self.prompt_logprobs

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``: a prompt as text or token ids, or a list of them (one choice each)."""

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def num_prompt_logprobs(self) -> int | None:
        """``echo`` with ``logprobs`` scores the prompt too (the legacy API's way to get log-likelihoods)."""
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        return self.prompt_logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request: one text or token-id list, or a batch of them (one choice each)."""
        p = self.prompt
        if isinstance(p, str) or not p or not isinstance(p[0], str | list):
            return [p]  # (an empty one is the input processor's to refuse)
        per_prompt = max(self.n, self.best_of or 1)
        if len(p) * per_prompt > MAX_BATCH_PROMPTS:
            raise APIError(
                f"prompt: {len(p)} prompts × {per_prompt} choices in one request, at most "
                f"{MAX_BATCH_PROMPTS} sequences",
                param="prompt",
                code="too_many_prompts",
            )
        return list(p)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message's answer to one of them

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError(f"content part of type {part.type!r} is not supported (text only)")
            parts.append(part.text)
        return "".join(parts)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            _unsupported("top_logprobs", "needs logprobs: true")

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
