"""What a request may ask of the server, and who may ask: size limits checked before any work, an API
key, Content-Type, CORS and Host checks. Every refusal is an OpenAI-style error body."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from sarathi.config import knob
from sarathi.entrypoints.openai.errors import APIError
from sarathi.entrypoints.openai.work_bounds import WorkLimits

DEFAULT_MAX_BODY_BYTES = 16 * 2**20
# Text prompts are tokenized off the event loop, but a bound keeps one request from holding a worker
# thread (and memory) for long: a token is rarely more than ~10 characters.
PROMPT_CHARS_PER_TOKEN = 32
DEFAULT_MAX_STOP_STRINGS = 32
DEFAULT_MAX_STOP_STRING_CHARS = 256
MAX_LOGPROBS = 20  # OpenAI's bound on top_logprobs, and the most SamplingParams accepts
# Routes outside /v1/ behind the key like /v1/*: the tokenizer's (a POST there needs a JSON body too) and
# the effective configuration (paths, limits, process ids).
_GUARDED_PATHS = ("/tokenize", "/detokenize", "/server_info")


@dataclass(frozen=True)
class RequestLimits(WorkLimits):
    """Bounds on one request; ``max_prompt_chars`` None means ``PROMPT_CHARS_PER_TOKEN`` x max_model_len."""

    max_body_bytes: int = knob(DEFAULT_MAX_BODY_BYTES, "bytes of a request body", type=int)
    max_prompt_chars: int | None = knob(
        None,
        f"prompt characters accepted before tokenizing (default {PROMPT_CHARS_PER_TOKEN} x context)",
        type=int,
    )
    max_stop_strings: int = knob(DEFAULT_MAX_STOP_STRINGS, "stop strings of a request", type=int)
    max_stop_string_chars: int = knob(DEFAULT_MAX_STOP_STRING_CHARS, "characters of a stop string", type=int)
    max_logprobs: int = knob(MAX_LOGPROBS, "alternatives per token a request may ask for", type=int)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.max_logprobs <= MAX_LOGPROBS:
            raise ValueError(f"--max-logprobs must be in [0, {MAX_LOGPROBS}], got {self.max_logprobs}")
        for name in ("max_body_bytes", "max_prompt_chars", "max_stop_strings", "max_stop_string_chars"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")

    def prompt_chars(self, max_model_len: int) -> int:
        return self.max_prompt_chars or PROMPT_CHARS_PER_TOKEN * max_model_len

    def check_prompt_chars(self, num_chars: int, max_model_len: int, param: str) -> None:
        limit = self.prompt_chars(max_model_len)
        if num_chars > limit:
            raise APIError(
                f"{param}: {num_chars} characters of text, more than this server accepts ({limit}; "
                "--max-prompt-chars)",
                param=param,
            )

    def check_stop(self, stop: tuple[str, ...]) -> None:
        if len(stop) > self.max_stop_strings:
            raise APIError(
                f"stop: {len(stop)} stop strings, at most {self.max_stop_strings} (--max-stop-strings)",
                param="stop",
            )
        if (longest := max((len(s) for s in stop), default=0)) > self.max_stop_string_chars:
            raise APIError(
                f"stop: a stop string of {longest} characters, at most {self.max_stop_string_chars} "
                "(--max-stop-string-chars)",
                param="stop",
            )

    def check_logprobs(self, num_logprobs: int | None, param: str) -> None:
        if num_logprobs is not None and num_logprobs > self.max_logprobs:
            raise APIError(
                f"{param}: {num_logprobs} alternatives per token, at most {self.max_logprobs} "
                "(--max-logprobs)",
                param=param,
            )


async def read_body(raw: Request, limit: int) -> bytes:
    """The request body, refused with a 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = raw.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in raw.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> APIError:
    return APIError(
        f"the request body has {size} bytes or more, more than this server accepts ({limit}; "
        "--max-body-bytes)",
        413,
        code="request_too_large",
    )


@dataclass(frozen=True)
class AccessPolicy:
    """Who may call the API: a bearer key for /v1/* and the tokenizer routes (None: anyone), browser
    origins allowed by CORS, and the Host names accepted (None: any)."""

    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None


def install_access_policy(app: FastAPI, policy: AccessPolicy) -> None:
    """Add the middlewares: CORS outermost (so preflights are answered), then the Host, key and
    Content-Type checks."""
    app.add_middleware(AccessCheck, policy=policy)
    if policy.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(policy.allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["authorization", "content-type"],
        )


class AccessCheck:
    """Pure ASGI middleware (a BaseHTTPMiddleware would hide client disconnects from the endpoints)."""

    def __init__(self, app, policy: AccessPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (error := self._refusal(scope)) is not None:
            await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope) -> APIError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path, method, policy = scope["path"], scope["method"], self.policy
        if policy.allowed_hosts is not None:
            host = _host_name(headers.get("host", ""))
            if host not in policy.allowed_hosts:
                return APIError(f"the Host header {host!r} is not allowed", 400, code="invalid_host")
        if not needs_api_key(path) or method == "OPTIONS":
            return None
        if policy.api_key is not None:
            expected = f"Bearer {policy.api_key}".encode()
            if not hmac.compare_digest(headers.get("authorization", "").encode(), expected):
                return APIError(
                    "invalid or missing API key", 401, type="authentication_error", code="invalid_api_key"
                )
        # A form-encoded or text/plain POST is a "simple" CORS request that skips the preflight.
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if method == "POST" and media != "application/json":
            return APIError(
                f"Content-Type must be application/json, got {media or 'none'!r}",
                415,
                code="unsupported_media_type",
            )
        return None


def needs_api_key(path: str) -> bool:
    """Whether ``path`` is behind the API key and the Content-Type check (the rest is health and metrics)."""
    return path.startswith("/v1/") or path in _GUARDED_PATHS


def _host_name(header: str) -> str:
    """'example.com:8000' -> 'example.com', '[::1]:8000' -> '::1'."""
    if header.startswith("["):
        return header[1 : header.find("]")].lower()
    return header.rsplit(":", 1)[0].lower()
