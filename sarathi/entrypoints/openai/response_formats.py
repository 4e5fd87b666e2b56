"""The JSON shapes of /v1/completions and /v1/chat/completions responses and stream chunks."""

from __future__ import annotations

import itertools
import time

from sarathi.entrypoints.openai.choices import ChoiceResult
from sarathi.entrypoints.openai.tool_calls import ToolCall, ToolPlan
from sarathi.entrypoints.openai.tool_stream import ToolCallStream
from sarathi.outputs import RequestOutput, TokenLogprob
from sarathi.tokenizer import Tokenizer


class CompletionFormat:
    """JSON shapes of /v1/completions."""

    id_prefix = "cmpl"

    def __init__(self, model: str, tokenizer: Tokenizer | None, show_prompt_logprobs: bool = False) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.show_prompt_logprobs = show_prompt_logprobs  # the request asked for vLLM's prompt_logprobs

    def chunk(self, rid: str, created: int, delta: RequestOutput, first: bool, index: int = 0) -> dict:
        choice = {
            "index": index,
            "text": delta.new_text,
            "logprobs": self.logprobs(delta.new_logprobs),
            "finish_reason": delta.finish_reason,
        }
        self._add_prompt_logprobs(choice, delta.prompt_logprobs)
        return self._envelope(rid, created, "text_completion", [choice])

    def final(self, rid: str, created: int, results: list[ChoiceResult]) -> dict:
        choices = []
        for i, r in enumerate(results):
            choice = {
                "index": i,
                "text": r.text,
                "logprobs": self.logprobs(r.logprobs),
                "finish_reason": r.finish_reason,
            }
            self._add_prompt_logprobs(choice, r.prompt_logprobs)
            choices.append(choice)
        return {**self._envelope(rid, created, "text_completion", choices), "usage": total_usage(results)}

    def _add_prompt_logprobs(self, choice: dict, prompt_logprobs: list[TokenLogprob | None] | None) -> None:
        if self.show_prompt_logprobs and prompt_logprobs is not None:
            choice["prompt_logprobs"] = self.prompt_logprobs(prompt_logprobs)

    def prompt_logprobs(self, logprobs: list[TokenLogprob | None]) -> list[dict | None]:
        """vLLM's shape: per prompt token (None for the first), ``{token id: {logprob, rank,
        decoded_token}}`` for the token itself and its most likely alternatives."""
        out: list[dict | None] = []
        for i, lp in enumerate(logprobs):
            if i % 32 == 31:
                time.sleep(0)  # offers the GIL: run in a worker thread, the event loop gets it back at once
            if lp is None:
                out.append(None)
                continue
            entry = {str(lp.token_id): self._scored(lp.token_id, lp.logprob, lp.rank)}
            for rank, (token_id, value) in enumerate(lp.top, start=1):
                entry.setdefault(str(token_id), self._scored(token_id, value, rank))
            out.append(entry)
        return out

    def _scored(self, token_id: int, logprob: float, rank: int | None) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": self._text(token_id)}

    def usage_chunk(self, rid: str, created: int, usage: dict) -> dict:
        return {**self._envelope(rid, created, "text_completion", []), "usage": usage}

    def logprobs(self, logprobs: list[TokenLogprob] | None) -> dict | None:
        if logprobs is None:
            return None
        tokens = [self._text(lp.token_id) for lp in logprobs]
        offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else []
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            # An echoed prompt's first token has no log probability and no alternatives (null, as OpenAI).
            "top_logprobs": [
                None if lp.logprob is None else {self._text(t): v for t, v in lp.top} for lp in logprobs
            ],
            "text_offset": offsets,
        }

    def _text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        texts = self.tokenizer.token_texts
        if 0 <= token_id < len(texts):
            return texts[token_id]
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _envelope(self, rid: str, created: int, obj: str, choices: list) -> dict:
        return {"id": rid, "object": obj, "created": created, "model": self.model, "choices": choices}


class ChatFormat(CompletionFormat):
    """JSON shapes of /v1/chat/completions."""

    id_prefix = "chatcmpl"

    def chunk(self, rid: str, created: int, delta: RequestOutput, first: bool, index: int = 0) -> dict:
        content = {"role": "assistant", "content": delta.new_text} if first else {"content": delta.new_text}
        choice = {
            "index": index,
            "delta": content,
            "logprobs": self.logprobs(delta.new_logprobs),
            "finish_reason": delta.finish_reason,
        }
        self._add_prompt_logprobs(choice, delta.prompt_logprobs)
        return self._envelope(rid, created, "chat.completion.chunk", [choice])

    def final(self, rid: str, created: int, results: list[ChoiceResult]) -> dict:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": r.text},
                "logprobs": self.logprobs(r.logprobs),
                "finish_reason": r.finish_reason,
            }
            for i, r in enumerate(results)
        ]
        body = {**self._envelope(rid, created, "chat.completion", choices), "usage": total_usage(results)}
        if self.show_prompt_logprobs and results and results[0].prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprobs(results[0].prompt_logprobs)  # as vLLM: one list
        return body

    def usage_chunk(self, rid: str, created: int, usage: dict) -> dict:
        return {**self._envelope(rid, created, "chat.completion.chunk", []), "usage": usage}

    def logprobs(self, logprobs: list[TokenLogprob] | None) -> dict | None:
        if logprobs is None:
            return None

        def entry(token_id: int, logprob: float) -> dict:
            text = self._text(token_id)
            raw = text.encode() if self.tokenizer is None else self.tokenizer.token_bytes(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(raw)}

        content = [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
            for lp in logprobs
        ]
        return {"content": content, "refusal": None}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """``usage`` of completions and chat; ``cached_tokens``: prompt tokens the prefix cache held."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def total_usage(results: list[ChoiceResult]) -> dict:
    """``usage`` summed over the choices of one response."""
    return usage(
        sum(r.num_prompt_tokens for r in results),
        sum(r.num_output_tokens for r in results),
        sum(r.num_cached_tokens for r in results),
    )


class ToolChatFormat(ChatFormat):
    """Chat shapes when the request's tools are in play: calls in ``message.tool_calls`` (and
    ``finish_reason`` "tool_calls"). Streaming: calls stream as the tokens come (a named function's
    arguments directly; "required" and "auto" output through ``ToolCallStream``)."""

    def __init__(
        self, model: str, tokenizer: Tokenizer | None, plan: ToolPlan, show_prompt_logprobs: bool = False
    ) -> None:
        super().__init__(model, tokenizer, show_prompt_logprobs)
        self.plan = plan
        self._streams: dict[int, ToolCallStream] = {}  # per choice index

    def chunk(self, rid: str, created: int, delta: RequestOutput, first: bool, index: int = 0) -> dict:
        content: dict = {"role": "assistant"} if first else {}
        finish = delta.finish_reason
        if self.plan.mode == "named":
            call = {"index": 0, "function": {"arguments": delta.new_text}}
            if first:
                call = ToolCall(self.plan.named, delta.new_text).as_json(0)
            content["tool_calls"] = [call]
            finish = "tool_calls" if finish == "stop" else finish
        else:
            stream = self._streams.setdefault(index, ToolCallStream(self.plan.mode))
            text, calls = stream.feed(delta.new_text, finished=finish is not None)
            if text:
                content["content"] = text
            if calls:
                content["tool_calls"] = calls
            if stream.num_calls and finish == "stop":
                finish = "tool_calls"
        choice = {
            "index": index,
            "delta": content,
            "logprobs": self.logprobs(delta.new_logprobs),
            "finish_reason": finish,
        }
        return self._envelope(rid, created, "chat.completion.chunk", [choice])

    def final(self, rid: str, created: int, results: list[ChoiceResult]) -> dict:
        body = super().final(rid, created, results)
        for choice, r in zip(body["choices"], results, strict=True):
            if r.finish_reason not in ("stop", "length"):
                continue
            text, calls = self.plan.parse(r.text, cut=r.finish_reason == "length")
            choice["message"] = {"role": "assistant", "content": text}
            if calls:
                choice["message"]["tool_calls"] = [c.as_json() for c in calls]
                if r.finish_reason == "stop":
                    choice["finish_reason"] = "tool_calls"
        return body
