"""``POST /tokenize`` and ``POST /detokenize`` with vLLM's request and response shapes.

``/tokenize`` takes ``{"prompt": str}`` or ``{"messages": [...], "add_generation_prompt": bool}`` (with
``tools`` and ``tool_choice``: the prompt chat completions would run, tool definitions included) and
answers ``{"count", "max_model_len", "tokens", "token_strs"}``; ``/detokenize`` takes ``{"tokens": [...]}``
and answers ``{"prompt": str}``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from sarathi.entrypoints.openai.errors import APIError
from sarathi.entrypoints.openai.protocol import ChatMessage, TokenId
from sarathi.entrypoints.openai.refusals import TOKENIZE
from sarathi.entrypoints.openai.request_checks import check_model, encode_chat, parse_request
from sarathi.entrypoints.openai.server_state import ServerState
from sarathi.entrypoints.openai.tool_calls import plan_tools


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: exactly one of ``prompt`` (text) or ``messages`` (a conversation).

    ``add_special_tokens`` defaults as in vLLM: True for a prompt (the tokenizer's BOS), False for
    messages (the chat template writes its own).
    """

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: bool = True
    tools: Any = None
    tool_choice: Any = None
    add_special_tokens: bool | None = None
    return_token_strs: bool = False

    def check_supported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise APIError("give either prompt or messages (exactly one)", param="prompt")


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids to text."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[TokenId]

    def check_supported(self) -> None:
        pass


def add_tokenize_routes(app: FastAPI, state: ServerState) -> None:
    """Register /tokenize and /detokenize on ``app``."""

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> dict:
        req = await parse_request(state, raw, TokenizeRequest, TOKENIZE)
        check_model(state, req.model)
        tokenizer = _tokenizer(state)
        if req.messages is not None:
            special = bool(req.add_special_tokens)
            tools = plan_tools(req.tools, req.tool_choice, state.tool_call_parser, True)
            ids = await encode_chat(state, req.messages, req.add_generation_prompt, special, tools)
        else:
            prompt = req.prompt or ""
            state.limits.check_prompt_chars(len(prompt), state.max_model_len, "prompt")
            special = True if req.add_special_tokens is None else req.add_special_tokens
            ids = await asyncio.to_thread(tokenizer.encode, prompt, special) if prompt else []
        return {
            "count": len(ids),
            "max_model_len": state.max_model_len,
            "tokens": ids,
            "token_strs": tokenizer.token_strs(ids) if req.return_token_strs else None,
        }

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> dict:
        req = await parse_request(state, raw, DetokenizeRequest, size_check=_detokenize_size_check(state))
        check_model(state, req.model)
        tokenizer = _tokenizer(state)
        if req.tokens:  # ids in the vocabulary: the input processor's check
            state.processor.prompt_token_ids(req.tokens, "tokens")
        text = await asyncio.to_thread(tokenizer.decode, req.tokens, False)
        return {"prompt": text}


def _detokenize_size_check(state: ServerState):
    def check(body: dict) -> None:
        if isinstance(tokens := body.get("tokens"), list):
            state.limits.check_detokenize(len(tokens), state.max_model_len)

    return check


def _tokenizer(state: ServerState):
    if state.tokenizer is None:
        raise APIError("this model has no tokenizer", 400, code="no_tokenizer")
    return state.tokenizer
