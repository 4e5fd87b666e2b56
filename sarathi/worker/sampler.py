"""Token sampling: greedy, temperature, top-k, top-p, min_p, logit bias and penalties, with per-request
seeds."""

from __future__ import annotations

import os

import torch

from sarathi.executor.messages import SampledToken
from sarathi.model.kernels import argmax_rows
from sarathi.outputs import TokenLogprob
from sarathi.sampling_params import SamplingParams
from sarathi.worker.logits_processing import apply_bias_and_penalties, apply_min_p

_SEED_MIX = 0x9E3779B97F4A7C15  # keeps (seed, step) pairs from colliding across requests
_MASK64 = (1 << 63) - 1
# Test-only fault injection: a request whose stop_token_ids contain this id makes sampling raise, so tests
# can check that one failing request fails alone while the engine keeps serving the others.
FAULT_TOKEN_ENV = "SARATHI_TEST_FAULT_TOKEN_ID"


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator that depends only on the request's seed and how many tokens it has emitted.

    That makes a seeded request's samples independent of batch company and of preemption.
    """
    return torch.Generator().manual_seed((seed * _SEED_MIX + step) & _MASK64)


class Sampler:
    """Picks one token per row of float32 logits, each row with its own ``SamplingParams``."""

    def __init__(self, seed: int = 0, eos_token_ids: tuple[int, ...] = ()) -> None:
        self._unseeded = torch.Generator().manual_seed(seed)
        self.eos_token_ids = eos_token_ids
        fault = os.environ.get(FAULT_TOKEN_ENV)
        self._fault_token_id = int(fault) if fault else None

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        steps: list[int],
        token_ids: list[list[int]] | None = None,
    ) -> list[SampledToken]:
        """Tokens and logprobs for every row; a row whose sampling raises fails alone.

        The rows are sampled together; only if that raises are they retried one by one, so the error is
        pinned on the request that caused it. ``token_ids[i]`` (prompt and output so far) is needed only
        for penalties.
        """
        try:
            return self._sample_rows(logits, params, steps, token_ids)
        except Exception:
            pass
        results = []
        for i in range(len(params)):
            try:
                history = None if token_ids is None else token_ids[i : i + 1]
                results.extend(
                    self._sample_rows(logits[i : i + 1], params[i : i + 1], steps[i : i + 1], history)
                )
            except Exception as e:
                results.append(SampledToken(None, error=f"sampling failed: {type(e).__name__}: {e}"))
        return results

    def _sample_rows(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        steps: list[int],
        token_ids: list[list[int]] | None,
    ) -> list[SampledToken]:
        if self._fault_token_id is not None and any(self._fault_token_id in p.stop_token_ids for p in params):
            raise RuntimeError(f"injected fault ({FAULT_TOKEN_ENV}={self._fault_token_id})")
        tokens = self(logits, params, steps, token_ids)
        logprobs = token_logprobs(logits, params, tokens)
        return [SampledToken(t, lp) for t, lp in zip(tokens, logprobs, strict=True)]

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        steps: list[int],
        token_ids: list[list[int]] | None = None,
    ) -> list[int]:
        """``steps[i]``: number of tokens row ``i``'s request has emitted so far (for seeded requests and
        penalties); ``token_ids[i]``: its prompt and output so far (for penalties)."""
        if logits.shape[0] != len(params):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(params)} requests")
        logits = logits.float()
        logits = self._mask_early_stops(logits, params, steps)
        logits = apply_bias_and_penalties(logits, params, steps, token_ids)
        logits = apply_min_p(logits, params)
        tokens = argmax_rows(logits).tolist()
        for i, p in enumerate(params):
            if not p.greedy:
                gen = self._unseeded if p.seed is None else step_generator(p.seed, steps[i])
                tokens[i] = _sample_row(logits[i], p, gen)
        return tokens

    def _mask_early_stops(
        self, logits: torch.Tensor, params: list[SamplingParams], steps: list[int]
    ) -> torch.Tensor:
        """Rows still short of ``min_tokens`` cannot pick EOS or a stop token id."""
        rows = [(i, p) for i, p in enumerate(params) if steps[i] < p.min_tokens]
        if not rows:
            return logits
        logits = logits.clone()  # the model's output may be an inference-mode tensor
        for i, p in rows:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_token_ids))
            if banned:
                logits[i, banned] = float("-inf")
        return logits


def token_logprobs(
    logits: torch.Tensor, params: list[SamplingParams], tokens: list[int]
) -> list[TokenLogprob | None]:
    """Log probabilities of the chosen tokens (and the top-n) for the rows that asked for them."""
    out: list[TokenLogprob | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return out
    logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
    top_n = max(params[i].logprobs for i in rows)
    top_values, top_ids = logprobs.topk(top_n, dim=-1) if top_n else (None, None)
    for k, i in enumerate(rows):
        n = params[i].logprobs
        top = ()
        if n:
            top = tuple(zip(top_ids[k, :n].tolist(), top_values[k, :n].tolist(), strict=True))
        out[i] = TokenLogprob(tokens[i], float(logprobs[k, tokens[i]]), top)
    return out


def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already cover top_p; the first token always stays.
        drop = (cum - sorted_logits.softmax(-1)) >= p.top_p
        logits = logits.index_fill(0, order[drop], float("-inf"))
    probs = logits.softmax(-1)
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, with our own generator.
    noise = torch.empty_like(probs).exponential_(generator=gen)
    return int((probs / noise).argmax())
