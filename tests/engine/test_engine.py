"""The engine and offline API on the embedded SmolLM2-135M: stopping, seeds, aborts, bad input, stats."""

from __future__ import annotations

import pytest
import torch

from sarathi import LLM, LLMEngine, SamplingParams, build_engine
from sarathi.config import engine_config
from sarathi.worker.sampler import FaultInjectingSampler

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    # float32: these tests compare log-probabilities with transformers' fp32 model.
    return LLM(num_kv_blocks=128, max_model_len=512, dtype="float32")


def _drain(engine: LLMEngine) -> dict:
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            if out.finished:
                finished[out.request_id] = out
    return finished


def test_chat_answers_and_stops_at_eos(llm):
    out = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=64), use_tqdm=False)[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop" and out.stop_reason is None
    assert llm.engine.eos_token_ids == (2,) and out.token_ids[-1] == 2
    m = out.metrics
    assert m.ttft > 0 and len(m.tbts) == len(out.token_ids) - 1 and m.scheduling_delay >= 0


def test_ignore_eos_and_max_tokens(llm):
    out = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True), use_tqdm=False)[
        0
    ]
    assert len(out.token_ids) == 40 and out.finish_reason == "length"


def test_stop_string_truncates_text(llm):
    story = [{"role": "user", "content": "Write a short poem of four lines about the sea."}]
    full = llm.chat(story, SamplingParams(temperature=0.0, max_tokens=48), use_tqdm=False)[0]
    assert "\n" in full.text.strip()
    stopped = llm.chat(story, SamplingParams(temperature=0.0, max_tokens=48, stop=["\n"]), use_tqdm=False)[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == "\n"
    assert "\n" not in stopped.text and full.text.startswith(stopped.text)
    kept = SamplingParams(temperature=0.0, max_tokens=48, stop=["\n"], include_stop_str_in_output=True)
    assert llm.chat(story, kept, use_tqdm=False)[0].text == stopped.text + "\n"


def test_streamed_deltas_hold_back_a_possible_stop_string(llm):
    """Concatenated new_text equals the final text: a partial stop string is never streamed."""
    story = [{"role": "user", "content": "Write a short poem of four lines about the sea."}]
    full = llm.chat(story, SamplingParams(temperature=0.0, max_tokens=48), use_tqdm=False)[0]
    words = full.text.split()
    stop = f"{words[3]} {words[4]}"  # a two-word stop string that appears mid-answer
    engine = llm.engine
    engine.add_request(
        "held",
        llm.get_tokenizer().apply_chat_template(story),
        SamplingParams(temperature=0.0, max_tokens=48, stop=[stop]),
    )
    deltas, last = [], None
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            deltas.append(out.new_text)
            assert stop not in "".join(deltas)
            last = out
    assert last.finish_reason == "stop" and last.stop_reason == stop
    assert "".join(deltas) == last.text == full.text[: full.text.index(stop)]


def test_min_tokens_suppresses_eos_and_stop_ids(llm):
    out = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=64), use_tqdm=False)[0]
    n = len(out.token_ids)  # ends with EOS
    longer = llm.chat(
        QUESTION, SamplingParams(temperature=0.0, max_tokens=64, min_tokens=n + 3), use_tqdm=False
    )[0]
    assert len(longer.token_ids) >= n + 3 and 2 not in longer.token_ids[: n + 3]
    assert longer.token_ids[: n - 1] == out.token_ids[: n - 1]
    with pytest.raises(ValueError, match="min_tokens must be an integer in"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_logprobs_match_transformers(llm, smollm2_path):
    import torch
    from transformers import AutoModelForCausalLM

    prompt = llm.get_tokenizer().encode("The three primary colors are")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=3, logprobs=4), use_tqdm=False)[0]
    hf = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt + out.token_ids])).logits[0].float(), dim=-1)
    assert out.new_logprobs is not None  # the last token's
    engine = llm.engine
    engine.add_request("lp", prompt, SamplingParams(temperature=0.0, max_tokens=3, logprobs=4))
    got = [o.new_logprobs[0] for o in _drain_all(engine)]
    for i, lp in enumerate(got):
        row = ref[len(prompt) - 1 + i]
        assert lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(row[lp.token_id].item(), abs=2e-3)
        top_ids, top_values = zip(*lp.top, strict=True)
        assert list(top_ids) == row.topk(4).indices.tolist()
        assert list(top_values) == pytest.approx(row.topk(4).values.tolist(), abs=2e-3)


def _drain_all(engine: LLMEngine) -> list:
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step().outputs)
    return outputs


def test_stop_token_ids(llm):
    full = llm.generate("The three primary colors are", GREEDY, use_tqdm=False)[0]
    stop_at = full.token_ids[3]
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_at])
    out = llm.generate("The three primary colors are", params, use_tqdm=False)[0]
    first = full.token_ids.index(stop_at)
    assert out.token_ids == full.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_generation_stops_at_max_model_len():
    small = LLM(num_kv_blocks=16, max_model_len=40)
    prompt = list(range(100, 130))
    out = small.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].token_ids) == 10 and out[0].finish_reason == "length"


def test_seeded_sampling_ignores_batch_company(llm):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=16, ignore_eos=True)
    alone = llm.generate("Once upon a time", seeded, use_tqdm=False)[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    batch = llm.generate(
        ["A long time ago in a galaxy", "Once upon a time", "def fibonacci(n):"],
        [others, seeded, others],
        use_tqdm=False,
    )
    assert batch[1].token_ids == alone
    reseeded = SamplingParams(temperature=0.9, top_p=0.95, seed=8, max_tokens=16, ignore_eos=True)
    assert llm.generate("Once upon a time", reseeded, use_tqdm=False)[0].token_ids != alone


def test_abort_frees_blocks_and_spares_the_others(llm):
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    expected = llm.generate("Hello there, my name is", params, use_tqdm=False)[0].token_ids
    engine.add_request("keep", "Hello there, my name is", params)
    engine.add_request("drop", "Tell me a very long story about dragons", params)
    for _ in range(3):
        engine.step()
    engine.abort_request("drop")
    finished = _drain(engine)
    assert set(finished) == {"keep"} and finished["keep"].token_ids == expected
    assert engine.block_manager.num_used_blocks == 0


def test_bad_requests_raise_and_leave_others_intact(llm):
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = llm.generate("The weather today is", params, use_tqdm=False)[0].token_ids
    engine.add_request("good", "The weather today is", params)
    with pytest.raises(ValueError, match=r"max_model_len|maximum|longer"):
        engine.add_request("too-long", list(range(1000, 1600)), params)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("good", "again", params)
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 49152\)"):
        engine.add_request("bad-ids", [1, 2, 10**6], params)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("empty", [], params)
    bad_stop = SamplingParams(max_tokens=8, min_tokens=1, stop_token_ids=[49152 + 5])
    with pytest.raises(ValueError, match=r"stop_token_ids must be token ids in \[0, 49152\)"):
        engine.add_request("bad-stop-id", "hi", bad_stop)
    finished = _drain(engine)
    assert set(finished) == {"good"} and finished["good"].token_ids == expected
    assert engine.block_manager.num_used_blocks == 0


def test_a_request_whose_sampling_raises_fails_alone(llm, monkeypatch):
    """Defence in depth: an exception while sampling one request finishes it with "error"; the batch's
    other requests get the tokens they would have got anyway."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = llm.generate("The weather today is", params, use_tqdm=False)[0].token_ids
    worker = engine.executor.worker
    faulty = FaultInjectingSampler(777, eos_token_ids=worker.sampler.eos_token_ids)
    monkeypatch.setattr(worker, "sampler", faulty)
    engine.add_request("good", "The weather today is", params)
    engine.add_request("faulty", "The weather today is", SamplingParams(max_tokens=8, stop_token_ids=[777]))
    finished = _drain(engine)
    assert finished["good"].token_ids == expected and finished["good"].error is None
    assert finished["faulty"].finish_reason == "error" and "injected fault" in finished["faulty"].error
    assert engine.block_manager.num_used_blocks == 0


def test_max_model_len_must_fit_the_kv_cache():
    """A max_model_len the KV cache cannot hold is refused at startup naming both numbers and the flags;
    without one, the context is capped to the cache (it used to refuse requests later, blaming the prompt)."""
    with pytest.raises(
        ValueError, match=r"max_model_len 512 does not fit the KV cache, which holds 64 tokens"
    ):
        LLM(num_kv_blocks=4, max_model_len=512)
    tiny = LLM(num_kv_blocks=4)
    assert tiny.engine.max_model_len == 64
    with pytest.raises(ValueError, match=r"prompt 1: .*max_model_len=64"):
        tiny.generate([[5] * 10, [5] * 100], SamplingParams(max_tokens=4), use_tqdm=False)
    assert not tiny.engine.has_unfinished_requests()
    out = tiny.generate([[5] * 60], SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="sarathi, vllm, orca, faster_transformer, simple_chunking"):
        engine_config(scheduler="fifo")
    with pytest.raises(ValueError, match="dtype"):
        engine_config(dtype="float16x")
    with pytest.raises(ValueError, match="unknown compute_dtype 'half'"):
        engine_config(compute_dtype="half")
    with pytest.raises(ValueError, match="compute_dtype 'bfloat16' needs dtype 'bfloat16'"):
        engine_config(dtype="float32", compute_dtype="bfloat16")
    with pytest.raises(ValueError, match="max_model_len 100000 exceeds"):
        LLM(max_model_len=100_000, num_kv_blocks=8)


def test_iteration_stats_account_for_every_token():
    llm = LLM(num_kv_blocks=64, token_budget=32, max_model_len=512)
    prompts = [list(range(200, 200 + n)) for n in (50, 9, 70)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    stats = list(llm.engine.stats)
    # The prompts share their first tokens: what the prefix cache held was not computed again.
    hits = sum(s.prefix_cache_hits for s in stats)
    assert sum(s.num_prefill_tokens for s in stats) + hits == 50 + 9 + 70
    assert sum(s.prefix_cache_queries for s in stats) == 50 + 9 + 70
    assert sum(s.num_decode_tokens for s in stats) == 3 * 4
    assert all(0 < s.num_tokens <= 32 and s.wall_time > 0 for s in stats)
    assert [s.iteration for s in stats] == list(range(len(stats)))


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_bf16_weights_halve_kv_memory_and_still_answer(compute_dtype):
    """--dtype bfloat16 stores weights and KV cache in bf16 (twice the blocks for the same memory budget),
    with fp32 or bf16 math."""
    budget = 0.05  # GiB
    fp32_blocks = build_engine(engine_config(kv_cache_memory_gib=budget, dtype="float32")).num_kv_blocks
    bf16 = LLM(dtype="bfloat16", compute_dtype=compute_dtype, kv_cache_memory_gib=budget, max_model_len=512)
    engine = bf16.engine
    assert engine.num_kv_blocks // 2 == fp32_blocks  # (budget // half a block: maybe one more)
    worker = engine.executor.worker
    assert all(t.dtype.is_floating_point and t.element_size() == 2 for kv in worker.kv_caches for t in kv)
    assert worker.model.compute_dtype == getattr(torch, compute_dtype)
    out = bf16.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)[0]
    assert "Paris" in out.text


def test_default_is_bf16_with_bf16_math_where_the_kernel_runs():
    """The serving default: bf16 weights and KV cache; bf16 GEMM inputs with fp32 accumulation where our
    kernel runs (else fp32 math)."""
    from sarathi.model import kernels

    llm = LLM(num_kv_blocks=64, max_model_len=256)
    worker = llm.engine.executor.worker
    assert worker.dtype == torch.bfloat16
    assert worker.model.compute_dtype == (torch.bfloat16 if kernels.available() else torch.float32)
    out = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)[0]
    assert "Paris" in out.text


def test_prefix_cache_reuses_a_repeated_prompt(llm):
    """On by default: a prompt sent again starts with its full blocks computed, and answers the same."""
    prompt = list(range(1000, 1040))  # 2 full blocks of 16 and a partial one
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    stats = llm.engine.stats
    before = len(stats)
    first = llm.generate([prompt], params, use_tqdm=False)[0]
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    runs = list(stats)[before:]
    assert again.token_ids == first.token_ids
    assert sum(s.prefix_cache_queries for s in runs) == 80
    assert sum(s.prefix_cache_hits for s in runs) == 32
    assert llm.engine.block_manager.num_used_blocks == 0
