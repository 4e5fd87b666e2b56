"""``n`` / ``best_of`` fan-out and prompt log probabilities, on the embedded SmolLM2-135M."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sarathi import LLM, SamplingParams
from sarathi.parallel_sampling import child_params, cumulative_logprob

PROMPT = (
    "The three primary colors are red, yellow and blue. Mixing red and yellow gives orange, mixing "
    "yellow and blue gives green, and mixing red and blue gives purple. Painters have known this for"
)


@pytest.fixture(scope="module")
def llm() -> LLM:
    # A budget of 16 splits the prompt into several chunks.
    return LLM(num_kv_blocks=256, max_model_len=512, token_budget=16, dtype="float32")


@pytest.fixture(scope="module")
def reference(smollm2_path, llm) -> tuple[list[int], torch.Tensor]:
    from transformers import AutoModelForCausalLM

    ids = llm.get_tokenizer().encode(PROMPT)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    with torch.no_grad():
        return ids, torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_prompt_logprobs_match_transformers_across_chunks_and_cached_prefixes(llm, reference):
    ids, ref = reference
    assert len(ids) > 2 * 16
    llm.generate(PROMPT, SamplingParams(max_tokens=1), use_tqdm=False)  # the prompt is now in the cache
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    got = out.prompt_logprobs
    assert len(got) == len(ids) and got[0] is None
    for pos in range(1, len(ids)):
        lp, row = got[pos], ref[pos - 1]
        assert lp.token_id == ids[pos]
        assert lp.logprob == pytest.approx(row[ids[pos]].item(), abs=2e-3)
        assert lp.rank == int((row > row[ids[pos]]).sum()) + 1
        assert [t for t, _ in lp.top] == row.topk(3).indices.tolist()


def test_n_choices_are_seeded_reproducible_and_share_the_prompt_blocks(llm):
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=7, n=3, ignore_eos=True)
    hits_before = sum(s.prefix_cache_hits for s in llm.engine.stats)
    first = llm.generate([PROMPT + " green", "Hello"], params, use_tqdm=False)
    hits = sum(s.prefix_cache_hits for s in llm.engine.stats) - hits_before
    again = llm.generate([PROMPT + " green", "Hello"], params, use_tqdm=False)
    for a, b in zip(first, again, strict=True):
        assert len(a.outputs) == 3 and [o.text for o in a.outputs] == [o.text for o in b.outputs]
        assert a.text == a.outputs[0].text
    assert len({o.text for o in first[0].outputs}) > 1  # seeds seed, seed + 1, seed + 2 differ
    # Choices 1 and 2 of the long prompt waited for choice 0's prefill and read its full blocks.
    block = llm.engine.block_manager.block_size
    assert hits >= 2 * ((len(llm.get_tokenizer().encode(PROMPT + " green")) - 1) // block) * block
    alone = llm.generate(PROMPT + " green", dataclasses.replace(params, n=1, seed=8), use_tqdm=False)[0]
    assert alone.text == first[0].outputs[1].text  # choice i is the request with seed + i


def test_best_of_keeps_the_most_likely_choices(llm):
    params = SamplingParams(temperature=1.0, max_tokens=5, seed=11, n=2, best_of=4, ignore_eos=True)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    assert len(out.outputs) == 2 and all(o.logprobs is None for o in out.outputs)
    singles = llm.generate([PROMPT] * 4, child_params(params), use_tqdm=False)
    scores = sorted(((cumulative_logprob(s.logprobs), s.text) for s in singles), reverse=True)
    assert [o.text for o in out.outputs] == [text for _, text in scores[:2]]


def test_the_engine_refuses_unexpanded_choices(llm):
    with pytest.raises(ValueError, match="one sequence per request"):
        llm.engine.add_request("x", "hi", SamplingParams(n=2))
    with pytest.raises(ValueError, match="best_of must be"):
        SamplingParams(n=3, best_of=2)
    with pytest.raises(ValueError, match="prompt_logprobs must be"):
        SamplingParams(prompt_logprobs=21)
