"""Gemma 3 270M (the packaged Q4_K_M GGUF, dequantized) served by the engine against transformers.

Prompts are 610-700 tokens, so every sliding layer's 512-token window is crossed, and half of them share a
400-token prefix, so prefix caching has something to reuse. The reference is transformers' fp32 greedy
generation on the same dequantized weights, computed once and cached on disk (it is the slow part). Every
configuration must produce the same 24 tokens per prompt, except after a proven near-tie (the rule of
test_output_invariance: at the first differing step the two tokens are the reference's top two, closer than
NEAR_TIE).
"""

from __future__ import annotations

import functools
import hashlib
import json

import pytest
import torch
from near_ties import check_same

from sarathi import LLM, SamplingParams
from sarathi.model.embedded import cache_root

MODEL = "gemma3-270m"
MAX_TOKENS = 24
NEAR_TIE = 1e-4
BF16_NEAR_TIE = 0.25  # as for SmolLM2: bf16 moves a logit by ~1e-2 of the logits' scale
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# Each budget, caching on and off, and a small cache for 8 prompts of ~650 tokens. Blocks are pages of three
# layers' KV (six KV-cache groups: one global, five sliding); under budget 512 a sliding group's quota is
# not capped below these prompts' length, so a sequence of b blocks is charged 6b pages (less the global
# prefix it shares): 452 pages admit the first two prompts (234 + 209 pages), and their decodes, growing
# by 6 pages a block, do not fit.
CONFIGS = {
    "budget16-nocache": dict(token_budget=16, enable_prefix_caching=False),
    "budget64-cache": dict(token_budget=64, enable_prefix_caching=True),
    "budget512-cache": dict(token_budget=512, enable_prefix_caching=True),
    "budget512-cache-preempt": dict(token_budget=512, enable_prefix_caching=True, num_kv_blocks=452),
}


@pytest.fixture(scope="module")
def gemma_path() -> str:
    from sarathi.model.embedded import packaged_model_path

    return packaged_model_path(MODEL)


@pytest.fixture(scope="module")
def prompts(gemma_path) -> list[list[int]]:
    return build_prompts(gemma_path)


def build_prompts(gemma_path: str) -> list[list[int]]:
    """8 prompts of 610-694 tokens, odd ones sharing a 400-token prefix."""
    import argparse
    import collections
    import inspect
    import logging
    import unittest

    from sarathi.tokenizer import Tokenizer

    text = "\n\n".join(inspect.getdoc(m) or "" for m in (argparse, collections, logging, unittest))
    tokens = Tokenizer(gemma_path).encode(text)  # starts with <bos>
    shared = tokens[:400]
    out = []
    for i in range(8):
        n = 610 + 12 * i
        if i % 2:  # the shared 400-token prefix, then a distinct tail
            tail = tokens[500 + 37 * i :]
            out.append(shared + tail[: n - 400])
        else:
            out.append([tokens[0], *tokens[1 + 41 * i :][: n - 1]])
    assert all(len(p) > 600 for p in out) and len(set(map(tuple, out))) == len(out)
    return out


@functools.cache
def _hf_model(gemma_path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gemma_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(gemma_path, prompts) -> list[list[int]]:
    """transformers' fp32 greedy tokens, cached on disk by prompts and weights (one computation per
    machine, ~1 minute)."""
    weights = (cache_root() / "models" / "gemma-3-270m" / "model.safetensors").stat()
    key = hashlib.sha256(json.dumps([prompts, MAX_TOKENS, weights.st_size]).encode()).hexdigest()[:16]
    path = cache_root() / "test-references" / f"gemma3-greedy-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    hf = _hf_model(gemma_path)
    out = []
    with torch.inference_mode():
        for p in prompts:
            gen = hf.generate(
                torch.tensor([p]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            out.append(gen[0, len(p) :].tolist())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


def _check_same(prompts, expected, got, gemma_path, label: str, near_tie: float = NEAR_TIE) -> int:
    return check_same(prompts, expected, got, lambda: _hf_model(gemma_path), label, near_tie)


# `make test-all` only (~25 s each). Sliding groups under preemption are also checked on a small random
# Gemma 3 (test_sliding_groups); budget 64 with caching stays here: chunk edges against the real window.
SLOW_CONFIGS = ("budget16-nocache", "budget512-cache", "budget512-cache-preempt")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CONFIGS else n for n in CONFIGS]
)
def test_gemma3_greedy_equals_transformers(name, prompts, reference, gemma_path):
    config = CONFIGS[name]
    with LLM(model=MODEL, dtype="float32", scheduler="sarathi", **config) as llm:
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
        stats = list(llm.engine.stats)
        used_blocks = llm.engine.block_manager.num_used_blocks
    _check_same(prompts, reference, [o.token_ids for o in outs], gemma_path, name)
    assert max(s.num_tokens for s in stats) <= config["token_budget"]
    hits = sum(s.prefix_cache_hits for s in stats)
    if name.endswith("preempt"):  # sliding groups free the prefix early and the small pool evicts it
        assert hits >= 400 - 16
    elif config["enable_prefix_caching"]:
        assert hits >= 3 * 400 - 16
    if name.endswith("preempt"):
        assert sum(s.num_preempted for s in stats) > 0, "the small KV cache should have forced preemptions"
    assert used_blocks == 0


def test_gemma3_default_matches_float32_except_near_ties(prompts, reference, gemma_path):
    """The default serves the file's Q4_K_M blocks (bf16 activations and KV cache)."""
    with LLM(model=MODEL) as llm:
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    got = [o.token_ids for o in outs]
    diverged = _check_same(prompts, reference, got, gemma_path, "default", BF16_NEAR_TIE)
    assert diverged <= len(prompts) // 2, f"{diverged} of {len(prompts)} prompts diverged from float32"
