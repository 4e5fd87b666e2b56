"""Sliding-window KV-cache groups through the whole engine: greedy outputs equal transformers' while sliding
layers drop their out-of-window blocks, under small budgets, prefix caching, preemption, and TP / PP workers.

A random-weight Gemma 3 of six layers (sliding, sliding, global, sliding, sliding, global) at window 8 and
4-token blocks: three KV-cache groups of two layers (two sliding, one global) sharing pages in two slots, so
layers of different groups write the same pools at different pages. Prompts of 21-90 tokens cross the window
many times; two share a 40-token prefix.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest
import torch
from near_ties import check_same

from sarathi import LLM, SamplingParams
from tests.random_checkpoint import write_random_folder

CONFIG = {
    "model_type": "gemma3_text",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    # Untied: with random tied embeddings the residual stream's own token wins every step by a mile, and
    # neither the tokens nor their probabilities would depend on what attention read.
    "tie_word_embeddings": False,
    "final_logit_softcapping": 30.0,
}
MAX_TOKENS = 12
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
NEAR_TIE = 1e-4
# The chosen tokens' log probabilities against transformers' (float32 both): they move when attention reads
# one wrong key (dropping a block one too early gives differences of 0.3-1.3), where greedy tokens may not.
LOGPROB_TOLERANCE = 1e-4
# Budget 4 puts chunk edges everywhere against the window and the blocks. At budget 16 a sliding table holds
# at most 7 blocks; a pool of 50 pages admits a few prompts whose decodes then outgrow it (measured: one
# preemption; 38 or 56 pages give none).
CONFIGS = {
    "budget4": dict(token_budget=4, enable_prefix_caching=False),
    "budget16-cache": dict(token_budget=16, enable_prefix_caching=True),
    "budget16-cache-preempt": dict(token_budget=16, enable_prefix_caching=True, num_kv_blocks=50),
    "pp2-cache-preempt": dict(
        token_budget=16, enable_prefix_caching=True, pipeline_parallel_size=2, num_kv_blocks=50
    ),
    "tp2": dict(token_budget=16, tensor_parallel_size=2),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gemma3-window8")
    write_random_folder(CONFIG, path, seed=1)
    return path


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(3, 320) for _ in range(40)]
    out = [[rng.randrange(3, 320) for _ in range(n)] for n in (21, 37, 64, 90)]
    out += [shared + [rng.randrange(3, 320) for _ in range(n)] for n in (13, 30)]
    return out


@functools.cache
def _hf_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(folder, prompts) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy tokens for each prompt and their log probabilities."""
    model = _hf_model(folder)
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            tokens = gen[0, len(p) :].tolist()
            logprobs = torch.log_softmax(model(gen).logits[0, len(p) - 1 : -1].float(), dim=-1)
            out.append((tokens, [logprobs[j, t].item() for j, t in enumerate(tokens)]))
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sliding_groups_keep_greedy_outputs(name, folder, prompts, reference):
    config = CONFIGS[name]
    with LLM(model=str(folder), dtype="float32", block_size=4, seed=0, **config) as llm:
        bm = llm.engine.block_manager
        assert bm.group_windows == (8, 8, None)
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
        stats = list(llm.engine.stats)
        assert bm.num_free_blocks == bm.num_available_blocks == bm.num_blocks
    expected = [tokens for tokens, _ in reference]
    check_same(prompts, expected, [o.token_ids for o in outs], lambda: _hf_model(folder), name, NEAR_TIE)
    for (tokens, logprobs), out in zip(reference, outs, strict=True):
        same = next(
            (j for j, (a, b) in enumerate(zip(tokens, out.token_ids, strict=True)) if a != b), len(tokens)
        )
        ours = [t.logprob for t in out.logprobs[:same]]
        assert ours == pytest.approx(logprobs[:same], abs=LOGPROB_TOLERANCE), name
    if "preempt" in name:
        assert sum(s.num_preempted for s in stats) > 0, "the small pool should have forced preemptions"
    if config.get("enable_prefix_caching"):
        assert sum(s.prefix_cache_hits for s in stats) >= 32
