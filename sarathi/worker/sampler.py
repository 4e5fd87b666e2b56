"""Token sampling: greedy, temperature, top-k, top-p, min_p, logit bias and penalties, with per-request
seeds."""

from __future__ import annotations

import os

import torch

from sarathi.engine.step_messages import SampledToken
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
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            temperature = torch.tensor([params[i].temperature for i in rows]).unsqueeze(1)
            probs = (logits[rows] / temperature).softmax(-1)  # one batched pass over the vocabulary
            for k, i in enumerate(rows):
                p = params[i]
                gen = self._unseeded if p.seed is None else step_generator(p.seed, steps[i])
                tokens[i] = _sample_row(probs[k], p, gen)
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


class FaultInjectingSampler(Sampler):
    """A ``Sampler`` that raises for rows whose request lists ``fault_token_id`` among its stop ids (tests
    only: set through ``$SARATHI_TEST_FAULT_TOKEN_ID``), kept out of the real sampler's path."""

    def __init__(self, fault_token_id: int, seed: int = 0, eos_token_ids: tuple[int, ...] = ()) -> None:
        super().__init__(seed, eos_token_ids)
        self.fault_token_id = fault_token_id

    def _sample_rows(self, logits, params, steps, token_ids):
        if any(self.fault_token_id in p.stop_token_ids for p in params):
            raise RuntimeError(f"injected fault ({FAULT_TOKEN_ENV}={self.fault_token_id})")
        return super()._sample_rows(logits, params, steps, token_ids)


def make_sampler(seed: int = 0, eos_token_ids: tuple[int, ...] = ()) -> Sampler:
    """The worker's sampler; with ``$SARATHI_TEST_FAULT_TOKEN_ID`` set (tests only), one that can fail."""
    fault = os.environ.get(FAULT_TOKEN_ENV)
    return FaultInjectingSampler(int(fault), seed, eos_token_ids) if fault else Sampler(seed, eos_token_ids)


def token_logprobs(
    logits: torch.Tensor, params: list[SamplingParams], tokens: list[int]
) -> list[TokenLogprob | None]:
    """Log probabilities of the chosen tokens (and the top-n) for the rows that asked for them."""
    out: list[TokenLogprob | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return out
    # log_softmax(x)[t] = x[t] - logsumexp(x): one reduction per row, not a vocabulary-wide result
    sub = logits[rows].float()
    lse = torch.logsumexp(sub, dim=-1, keepdim=True)
    chosen = (sub.gather(1, torch.tensor([[tokens[i]] for i in rows])) - lse)[:, 0].tolist()
    top_n = max(params[i].logprobs for i in rows)
    top_values, top_ids = sub.topk(top_n, dim=-1) if top_n else (None, None)
    if top_n:
        top_values = top_values - lse
    for k, i in enumerate(rows):
        n = params[i].logprobs
        top = ()
        if n:
            top = tuple(zip(top_ids[k, :n].tolist(), top_values[k, :n].tolist(), strict=True))
        out[i] = TokenLogprob(tokens[i], chosen[k], top)
    return out


# Top-p alone looks for its nucleus among the most likely tokens first; a full sort of a 262k vocabulary
# costs ~75 ms a row, the top 1,024 ~2.6 ms.
_NUCLEUS_CANDIDATES = 1024


def _sample_row(probs: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
    """One token from `probs` (a row's softmax after temperature), cut to top_k and then top_p.

    Draws by inverting the cumulative distribution at one uniform number from `gen`: exact, and the only
    full-vocabulary pass is the cumulative sum (an exponential race needs a random number per token).
    """
    vocab = probs.numel()
    top_k = p.top_k if 0 < p.top_k < vocab else 0
    if not top_k and p.top_p >= 1.0:
        return _invert_cdf(probs, gen)
    width = top_k or min(vocab, _NUCLEUS_CANDIDATES)
    cand_probs, cand_ids = probs.topk(width)  # sorted, most likely first
    if top_k:
        cand_probs = cand_probs / cand_probs.sum()  # top_p applies to the distribution over the k
    if p.top_p < 1.0:
        cum = cand_probs.cumsum(0)
        if not top_k and width < vocab and cum[-1] < p.top_p:  # a flat distribution: nucleus beyond the top
            cand_probs, cand_ids = probs.sort(descending=True)
            cum = cand_probs.cumsum(0)
        # Keep a token while the tokens before it do not yet cover top_p; the first always stays.
        keep = int(((cum - cand_probs) < p.top_p).sum().clamp(min=1))
        cand_probs, cand_ids = cand_probs[:keep], cand_ids[:keep]
    return int(cand_ids[_invert_cdf(cand_probs, gen)])


def _invert_cdf(weights: torch.Tensor, gen: torch.Generator) -> int:
    """Index i drawn with probability weights[i] / sum(weights)."""
    cum = weights.double().cumsum(0)
    u = torch.rand(1, generator=gen, dtype=torch.float64) * cum[-1]
    return int(torch.searchsorted(cum, u, right=True).clamp(max=weights.numel() - 1))
