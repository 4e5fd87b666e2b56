"""Structured outputs survive preemption by recompute: a readmitted request's matcher replays its outputs,
so every output still matches its schema, and greedy outputs equal those of a run without preemption."""

from __future__ import annotations

import json

from sarathi import LLM, SamplingParams
from sarathi.structured_output import StructuredOutput

SCHEMA = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 99},
    "minItems": 10,
    "maxItems": 10,
}


def test_constrained_requests_survive_preemption(smollm2_tokenizer):
    prompts = [f"Request {i}: list ten numbers between 0 and 99 as a JSON array." for i in range(8)]
    params = SamplingParams(
        temperature=0.0, max_tokens=48, structured_output=StructuredOutput.json_schema(SCHEMA)
    )
    with LLM(scheduler="vllm", num_kv_blocks=128) as llm:
        reference = [o.text for o in llm.generate(prompts, params, use_tqdm=False)]
    # 8 prompts of ~20 tokens fit 20 blocks of 16, their ~55 tokens with outputs do not: decodes run out
    # of slots and the newest requests are preempted.
    with LLM(scheduler="vllm", num_kv_blocks=20) as llm:
        outs = llm.generate(prompts, params, use_tqdm=False)
        preempted = sum(s.num_preempted for s in llm.engine.stats)
    assert preempted > 0
    for out, expected in zip(outs, reference, strict=True):
        assert out.finish_reason == "stop", out
        values = json.loads(out.text)
        assert len(values) == 10 and all(0 <= v <= 99 for v in values)
        assert out.text == expected
