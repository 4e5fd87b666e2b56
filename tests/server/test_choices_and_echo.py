"""``n``, ``best_of``, ``echo`` and ``prompt_logprobs`` through the official openai client."""

from __future__ import annotations

import pytest
import torch

from tests.server.conftest import post_body

PROMPT = "The three primary colors are red, yellow and"
SEEDED = {"max_tokens": 5, "temperature": 1.0, "seed": 5, "extra_body": {"ignore_eos": True}}


def test_n_choices_are_indexed_reproducible_and_count_the_prompt_once(openai_client, model_name):
    r = openai_client.completions.create(model=model_name, prompt=PROMPT, n=3, **SEEDED)
    again = openai_client.completions.create(model=model_name, prompt=PROMPT, n=3, **SEEDED)
    one = openai_client.completions.create(model=model_name, prompt=PROMPT, **SEEDED)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [c.text for c in again.choices]
    assert r.choices[0].text == one.choices[0].text  # choice 0 uses the request's seed
    assert r.usage.prompt_tokens == one.usage.prompt_tokens and r.usage.completion_tokens == 15

    chat = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hi!"}], n=2, **SEEDED
    )
    assert [c.index for c in chat.choices] == [0, 1] and all(c.message.content for c in chat.choices)


def test_n_streams_interleaved_choices_and_best_of(openai_client, model_name):
    texts: dict[int, str] = {}
    for chunk in openai_client.completions.create(
        model=model_name, prompt=[PROMPT, "def fib(n):"], n=2, stream=True, **SEEDED
    ):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    batch = openai_client.completions.create(model=model_name, prompt=[PROMPT, "def fib(n):"], n=2, **SEEDED)
    assert texts == {c.index: c.text for c in batch.choices} and len(texts) == 4

    best = openai_client.completions.create(
        model=model_name, prompt=PROMPT, n=2, best_of=4, logprobs=0, **SEEDED
    )
    scores = [sum(c.logprobs.token_logprobs) for c in best.choices]
    assert len(best.choices) == 2 and scores[0] >= scores[1]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2, "best_of": 1}, "best_of"),
        ({"n": 2, "best_of": 3, "stream": True}, "best_of"),
        ({"n": 0}, "n"),
        ({"n": 65}, "n"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": ["a"] * 100, "n": 3}, "prompt"),
    ],
)
def test_bad_choice_counts_are_refused(server, body, param):
    r = post_body(f"{server.url}/v1/completions", {"prompt": "hi", "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_echo_with_logprobs_scores_the_prompt_like_transformers(openai_client, model_name, server):
    from transformers import AutoModelForCausalLM

    from sarathi.model import embedded_model_path

    r = openai_client.completions.create(
        model=model_name, prompt=PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    choice = r.choices[0]
    assert choice.text.startswith(PROMPT)
    ids = post_body(f"{server.url}/tokenize", {"prompt": PROMPT}).json()["tokens"]
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == choice.text and lp.text_offset[-1] == len(PROMPT)
    hf = AutoModelForCausalLM.from_pretrained(embedded_model_path(), dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    expected = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert lp.token_logprobs[1 : len(ids)] == pytest.approx(expected, abs=2e-3)
    assert lp.token_logprobs[-1] == pytest.approx(ref[-1].max().item(), abs=2e-3)  # the greedy token

    streamed = "".join(
        c.choices[0].text
        for c in openai_client.completions.create(
            model=model_name, prompt=PROMPT, echo=True, max_tokens=1, temperature=0, stream=True
        )
    )
    assert streamed == choice.text


def test_prompt_logprobs_in_vllm_shape(openai_client, model_name):
    r = openai_client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) > 5
    for entry in plp[1:]:
        assert 2 <= len(entry) <= 3 and {1, 2} <= {v["rank"] for v in entry.values()}
        assert all(v["logprob"] <= 0 and isinstance(v["decoded_token"], str) for v in entry.values())
    chat = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=1,
        extra_body={"prompt_logprobs": 0},
    )
    assert chat.model_extra["prompt_logprobs"][0] is None
