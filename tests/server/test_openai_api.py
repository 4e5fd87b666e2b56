"""The official openai client against a live ``sarathi serve`` on the embedded model."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import openai
import pytest

from sarathi import LLM, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn rain.",
    "Name three planets of the solar system.",
    "Explain what a hash table is in one sentence.",
]


@pytest.fixture(scope="module")
def strict_client(server):
    return openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=300,
        _strict_response_validation=True,
    )


def test_models_health_version(server, model_name):
    assert model_name == "SmolLM2-135M-Instruct"
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/version").json()["version"]


def test_chat_non_streaming_strict(strict_client, model_name):
    r = strict_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == model_name and r.id.startswith("chatcmpl-")
    assert "Paris" in choice.message.content and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert (
        r.usage.completion_tokens >= 1
        and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    )


def test_completion_non_streaming_strict(strict_client, model_name):
    r = strict_client.completions.create(
        model=model_name, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == 5
    assert "Paris" in r.choices[0].text


def test_chat_streaming_with_usage_matches_non_streaming(strict_client, openai_client, model_name):
    messages = [{"role": "user", "content": "Write a haiku about autumn rain."}]
    full = strict_client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=24, temperature=0
    )
    chunks = list(
        strict_client.chat.completions.create(
            model=model_name,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *token_chunks, usage_chunk = chunks
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == full.usage.completion_tokens
    assert token_chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in token_chunks]
    assert finish[-1] == full.choices[0].finish_reason and all(f is None for f in finish[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in token_chunks) == full.choices[0].message.content
    assert len(token_chunks) == full.usage.completion_tokens  # one chunk per generated token


def test_completion_streaming(openai_client, model_name):
    stream = openai_client.completions.create(
        model=model_name, prompt="def fibonacci(n):", max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert len(chunks) == 12 and chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_stop_strings_stream_equals_final_text(openai_client, model_name):
    kw = dict(model=model_name, prompt="1, 2, 3, 4,", max_tokens=40, temperature=0, stop=[" 8"])
    full = openai_client.completions.create(**kw)
    streamed = "".join(c.choices[0].text for c in openai_client.completions.create(**kw, stream=True))
    assert full.choices[0].finish_reason == "stop" and " 8" not in full.choices[0].text
    assert streamed == full.choices[0].text


def test_logprobs_chat_and_completions(strict_client, openai_client, model_name):
    r = strict_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert b"".join(bytes(e.bytes) for e in content).decode().startswith(r.choices[0].message.content)
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the most likely token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
    full = openai_client.completions.create(
        model=model_name, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2
    )
    lp = full.choices[0].logprobs
    assert "".join(lp.tokens) == full.choices[0].text and len(lp.token_logprobs) == 5
    assert all(len(top) == 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    streamed = list(
        openai_client.completions.create(
            model=model_name,
            prompt="The capital of France is",
            max_tokens=5,
            temperature=0,
            logprobs=2,
            stream=True,
        )
    )
    assert [c.choices[0].logprobs.token_logprobs[0] for c in streamed] == pytest.approx(lp.token_logprobs)


def test_greedy_outputs_equal_offline_generate(openai_client, model_name, server):
    params = SamplingParams(temperature=0.0, max_tokens=24)
    llm = LLM(num_kv_blocks=512, dtype="float32")  # as the server runs
    tok = llm.get_tokenizer()
    offline = llm.generate(
        [tok.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS], params
    )
    offline_text = llm.generate(["The best way to learn", "In 1492,"], params, use_tqdm=False)
    for q, out in zip(QUESTIONS, offline, strict=True):
        r = openai_client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": q}], max_tokens=24, temperature=0
        )
        assert r.choices[0].message.content == out.text and r.usage.completion_tokens == len(out.token_ids)
    for prompt, out in zip(["The best way to learn", "In 1492,"], offline_text, strict=True):
        r = openai_client.completions.create(model=model_name, prompt=prompt, max_tokens=24, temperature=0)
        assert r.choices[0].text == out.text
    # Token-id prompts are accepted too (what load generators send).
    ids = tok.encode("The best way to learn")
    r = openai_client.completions.create(model=model_name, prompt=ids, max_tokens=24, temperature=0)
    assert r.choices[0].text == offline_text[0].text
    # Logit controls (penalties, logit_bias, min_p, seed) give what the offline API gives.
    the = tok.encode(" the")[0]
    controls = SamplingParams(
        temperature=0.0, max_tokens=24, frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.3,
        logit_bias={the: -100},
    )  # fmt: skip
    sampled = SamplingParams(temperature=0.8, max_tokens=16, min_p=0.1, seed=7, frequency_penalty=0.5)
    want = [llm.generate(["The best way to learn"], p, use_tqdm=False)[0] for p in (controls, sampled)]
    assert want[0].text != offline_text[0].text and the not in want[0].token_ids
    r = openai_client.completions.create(
        model=model_name,
        prompt="The best way to learn",
        max_tokens=24,
        temperature=0,
        frequency_penalty=1.5,
        presence_penalty=0.5,
        logit_bias={str(the): -100},
        extra_body={"repetition_penalty": 1.3},
    )
    assert r.choices[0].text == want[0].text
    r = openai_client.completions.create(
        model=model_name,
        prompt="The best way to learn",
        max_tokens=16,
        temperature=0.8,
        seed=7,
        frequency_penalty=0.5,
        extra_body={"min_p": 0.1},
    )
    assert r.choices[0].text == want[1].text


def test_32_concurrent_streams_complete_in_order(server, model_name):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[list[str], str | None, int]:
        stream = await client.completions.create(
            model=model_name,
            prompt=f"Request {i}: count from 1 to 20:",
            max_tokens=16 + i % 5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        texts, finish, usage = [], None, 0
        async for chunk in stream:
            if chunk.choices:
                assert finish is None, "a chunk arrived after the finish_reason"
                texts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason
            else:
                usage = chunk.usage.completion_tokens
        return texts, finish, usage

    async def main():
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=600
        ) as c:
            return await asyncio.gather(*(one(c, i) for i in range(32)))

    results = asyncio.run(main())
    for i, (texts, finish, usage) in enumerate(results):
        assert finish == "length" and usage == 16 + i % 5 == len(texts)


def test_metrics_count_prefix_cache_hits(openai_client, model_name, server):
    """The same prompt twice: the second finds its full blocks in the cache, counted in tokens."""
    before = server.metrics()
    prompt = "The prefix cache test: " + " ".join(f"word{i}" for i in range(30))
    for _ in range(2):
        openai_client.completions.create(model=model_name, prompt=prompt, max_tokens=1, temperature=0.0)
    after = server.metrics()
    queries = after["sarathi_prefix_cache_queries_total"] - before.get(
        "sarathi_prefix_cache_queries_total", 0
    )
    hits = after["sarathi_prefix_cache_hits_total"] - before.get("sarathi_prefix_cache_hits_total", 0)
    assert queries > 32 and hits >= 16 and hits % 16 == 0 and hits < queries


def test_cached_tokens_count_prefix_cache_hits(strict_client, model_name):
    """A repeated long prompt reads its full blocks from the prefix cache; a new one reads none."""
    marker = uuid.uuid4().hex  # first, so nothing of this prompt was cached before
    long = [{"role": "system", "content": f"{marker} " + "The sea is calm tonight. " * 40}]
    first = strict_client.chat.completions.create(model=model_name, messages=long, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = strict_client.chat.completions.create(model=model_name, messages=long, max_tokens=1)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens and cached % 16 == 0  # whole blocks
    chunks = list(
        strict_client.chat.completions.create(
            model=model_name, messages=long, max_tokens=1, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached
    prompt = f"{uuid.uuid4().hex} " + "Once upon a time " * 40
    new = strict_client.completions.create(model=model_name, prompt=prompt, max_tokens=1)
    assert new.usage.prompt_tokens_details.cached_tokens == 0
    repeated = strict_client.completions.create(model=model_name, prompt=prompt, max_tokens=1)
    assert repeated.usage.prompt_tokens_details.cached_tokens > 0
    response = strict_client.responses.create(
        model=model_name, instructions=long[0]["content"], input="Hi", max_output_tokens=1
    )
    assert response.usage.input_tokens_details.cached_tokens >= cached - 16  # the same system message
