"""The JSON shapes of /v1/completions and /v1/chat/completions responses and stream chunks."""

from __future__ import annotations

from dataclasses import dataclass

from sarathi.outputs import RequestOutput, TokenLogprob
from sarathi.tokenizer import Tokenizer


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice of a non-streaming response (one per prompt)."""

    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None
    num_prompt_tokens: int
    num_output_tokens: int


class CompletionFormat:
    """JSON shapes of /v1/completions."""

    id_prefix = "cmpl"

    def __init__(self, model: str, tokenizer: Tokenizer | None) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def chunk(self, rid: str, created: int, delta: RequestOutput, first: bool, index: int = 0) -> dict:
        choice = {
            "index": index,
            "text": delta.new_text,
            "logprobs": self.logprobs(delta.new_logprobs),
            "finish_reason": delta.finish_reason,
        }
        return self._envelope(rid, created, "text_completion", [choice])

    def final(self, rid: str, created: int, results: list[ChoiceResult]) -> dict:
        choices = [
            {
                "index": i,
                "text": r.text,
                "logprobs": self.logprobs(r.logprobs),
                "finish_reason": r.finish_reason,
            }
            for i, r in enumerate(results)
        ]
        return {**self._envelope(rid, created, "text_completion", choices), "usage": total_usage(results)}

    def usage_chunk(self, rid: str, created: int, usage: dict) -> dict:
        return {**self._envelope(rid, created, "text_completion", []), "usage": usage}

    def logprobs(self, logprobs: list[TokenLogprob] | None) -> dict | None:
        if logprobs is None:
            return None
        tokens = [self._text(lp.token_id) for lp in logprobs]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{self._text(t): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }

    def _text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
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
        return {**self._envelope(rid, created, "chat.completion", choices), "usage": total_usage(results)}

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


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def total_usage(results: list[ChoiceResult]) -> dict:
    """``usage`` summed over the choices of one response."""
    return usage(sum(r.num_prompt_tokens for r in results), sum(r.num_output_tokens for r in results))
