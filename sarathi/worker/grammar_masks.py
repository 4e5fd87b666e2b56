"""Structured-output masks on the sampling worker: one llguidance matcher per constrained request.

Before sampling, every constrained row's matcher writes its allowed-token bitmask (32 tokens per int32
word) into one batch tensor, which is unpacked with shifts and applied to those logit rows at once;
after sampling, each matcher consumes its row's token. Rows without a constraint cost nothing, and a
batch without any costs one dictionary check. A request readmitted after preemption arrives again as a
``NewRequest`` with its outputs so far: its matcher is rebuilt and replays them.
"""

from __future__ import annotations

import os

import torch

from sarathi.executor.messages import SampledToken
from sarathi.structured_output import StructuredOutput, to_grammar


class GrammarMasks:
    """The matchers of the constrained requests this worker samples for, by request id."""

    def __init__(self, tokenizer_dir: str | None, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._tokenizer = None  # built on first use (~0.3 s for a 49k vocabulary)
        self._matchers: dict[str, object] = {}
        self._errors: dict[str, str] = {}
        self._shifts = torch.arange(32, dtype=torch.int32)
        self._minus_inf = torch.tensor(float("-inf"))

    def __len__(self) -> int:
        return len(self._matchers) + len(self._errors)

    def add(self, request_id: str, constraint: StructuredOutput, output_token_ids: list[int]) -> None:
        """A fresh matcher for ``request_id`` that has consumed ``output_token_ids`` (its outputs so far)."""
        self.remove(request_id)
        try:
            from llguidance import LLMatcher

            matcher = LLMatcher(self._llg_tokenizer(), to_grammar(constraint), log_level=0)
            if output_token_ids:
                matcher.consume_tokens(list(output_token_ids))
            if matcher.is_error():
                raise ValueError(matcher.get_error())
        except Exception as e:
            self._errors[request_id] = f"structured output: {e}"
            return
        self._matchers[request_id] = matcher

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)
        self._errors.pop(request_id, None)

    def apply(self, logits: torch.Tensor, request_ids: list[str]) -> tuple[torch.Tensor, dict[int, str]]:
        """``logits`` (one row per id) with every constrained row's disallowed tokens at -inf, and the
        rows whose matcher failed (row -> error)."""
        if not len(self):
            return logits, {}
        failed = {i: self._errors[r] for i, r in enumerate(request_ids) if r in self._errors}
        rows = [i for i, r in enumerate(request_ids) if r in self._matchers]
        if not rows:
            return logits, failed
        words = (self.vocab_size + 31) // 32
        bitmask = torch.zeros((len(rows), words), dtype=torch.int32)
        row_bytes = words * 4
        for k, i in enumerate(rows):
            matcher = self._matchers[request_ids[i]]
            matcher.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), row_bytes)
            if matcher.is_error():
                failed[i] = f"structured output: {matcher.get_error()}"
        bits = (bitmask.unsqueeze(-1) >> self._shifts) & 1
        allowed = bits.view(len(rows), -1)[:, : logits.shape[1]].bool()
        logits = logits.float()
        if len(rows) == logits.shape[0]:
            return torch.where(allowed, logits, self._minus_inf), failed
        index = torch.tensor(rows)
        masked = logits.clone()  # the model's output may be an inference-mode tensor: never in place
        masked[index] = torch.where(allowed, logits[index], self._minus_inf)
        return masked, failed

    def advance(self, request_ids: list[str], sampled: list[SampledToken]) -> None:
        """Each constrained row's matcher consumes the token sampled for it."""
        if not self._matchers:
            return
        for request_id, token in zip(request_ids, sampled, strict=True):
            matcher = self._matchers.get(request_id)
            if matcher is not None and token.token_id is not None:
                matcher.consume_token(token.token_id)

    def _llg_tokenizer(self):
        if self._tokenizer is None:
            from llguidance import LLTokenizer

            path = os.path.join(self.tokenizer_dir or "", "tokenizer.json")
            if self.tokenizer_dir is None or not os.path.isfile(path):
                raise ValueError("this model has no tokenizer.json; structured outputs need one")
            with open(path) as f:
                self._tokenizer = LLTokenizer(
                    f.read(), n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids)
                )
        return self._tokenizer
