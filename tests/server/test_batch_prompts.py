"""Several prompts in one /v1/completions request: one choice per prompt, streaming or not."""

from __future__ import annotations

import pytest

from tests.server.conftest import post_body

PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time"]
GREEDY = {"max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def singles(openai_client, model_name) -> list:
    return [openai_client.completions.create(model=model_name, prompt=p, **GREEDY) for p in PROMPTS]


def test_text_batch_equals_one_request_per_prompt(openai_client, model_name, singles):
    r = openai_client.completions.create(model=model_name, prompt=PROMPTS, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [s.choices[0].text for s in singles]
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert r.usage.completion_tokens == 18 and r.usage.total_tokens == r.usage.prompt_tokens + 18


def test_token_id_batch_and_streaming(server, openai_client, model_name, singles):
    ids = [post_body(f"{server.url}/tokenize", {"prompt": p}).json()["tokens"] for p in PROMPTS[:2]]
    r = openai_client.completions.create(model=model_name, prompt=ids, **GREEDY)
    assert [c.text for c in r.choices] == [s.choices[0].text for s in singles[:2]]

    texts, usage_chunks = {}, []
    for chunk in openai_client.completions.create(
        model=model_name, prompt=PROMPTS, stream=True, stream_options={"include_usage": True}, **GREEDY
    ):
        if not chunk.choices:
            usage_chunks.append(chunk.usage)
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {i: s.choices[0].text for i, s in enumerate(singles)}
    assert len(usage_chunks) == 1 and usage_chunks[0].completion_tokens == 18


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ["fine", ""]}, "prompt"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"prompt": [[1, 2], [10_000_000]]}, "prompt"),
        ({"prompt": ["x"] * 257}, "prompt"),
        ({"prompt": "hi", "suffix": " the end"}, "suffix"),
    ],
)
def test_bad_batches_are_refused_whole(server, body, param):
    r = post_body(f"{server.url}/v1/completions", {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] and error["message"]
    assert server.metrics()["sarathi_num_requests_running"] == 0
