"""What a large vocabulary costs per iteration: the LM head and everything the sampler does over the logits.

At a batch of running requests (default 32) and the model's vocabulary (Gemma 3: 262,144 tokens), times each
per-iteration step that scales with the vocabulary, on the serving default precision (bf16 weights, bf16
GEMM inputs):

- the final norm and LM head over the batch's sampling rows (and over one row);
- greedy sampling (the argmax kernel), and temperature / top-p / top-k sampling;
- log-probabilities of the chosen tokens with the top 5;
- repetition, frequency and presence penalties over 1,000-token histories;
- the structured-output bitmask of a JSON schema on every row (mask, then each matcher's advance).

Prints the median milliseconds per iteration of each and saves them with the machine and commit:

    python -m benchmarks.vocab_costs [--model gemma3-270m] [--batch 32] [--iterations 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.record import save_result
from sarathi.engine.step_messages import SampledToken
from sarathi.model import SeqSlice, allocate_kv_cache, build_attention_metadata, load_model
from sarathi.sampling_params import SamplingParams
from sarathi.structured_output import StructuredOutput
from sarathi.tokenizer import Tokenizer
from sarathi.worker.grammar_masks import GrammarMasks
from sarathi.worker.sampler import Sampler, token_logprobs

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age", "tags"],
}
DOCUMENT = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry", "engines"]}


def median_ms(fn: Callable[[], object], iterations: int) -> float:
    """Median wall time of `fn` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    model, arch, tokenizer_dir = load_model(args.model, dtype=torch.bfloat16, compute_dtype=torch.bfloat16)
    vocab, batch, n = arch.vocab_size, args.batch, args.iterations
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(batch, arch.hidden_size, generator=gen)
    logits = _real_logits(model, arch, Tokenizer(tokenizer_dir), batch)
    greedy = [SamplingParams(temperature=0.0)] * batch
    sampled = [SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=i) for i in range(batch)]
    with_logprobs = [SamplingParams(temperature=0.0, logprobs=5)] * batch
    penalized = [
        SamplingParams(temperature=0.0, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5)
    ] * batch
    histories = [torch.randint(0, vocab, (1000,), generator=gen).tolist() for _ in range(batch)]
    steps = [200] * batch
    sampler = Sampler(eos_token_ids=arch.eos_token_ids)
    tokens = sampler(logits, greedy, steps)

    rows: dict[str, float] = {}
    with torch.inference_mode():
        rows["lm_head (norm + head), batch rows"] = median_ms(lambda: model.lm_head(model.norm(hidden)), n)
        rows["lm_head (norm + head), 1 row"] = median_ms(lambda: model.lm_head(model.norm(hidden[:1])), n)
    rows["greedy sampling"] = median_ms(lambda: sampler(logits, greedy, steps), n)
    rows["temperature 0.8, top_p 0.95, top_k 50"] = median_ms(lambda: sampler(logits, sampled, steps), n)
    rows["logprobs (chosen + top 5)"] = median_ms(lambda: token_logprobs(logits, with_logprobs, tokens), n)
    rows["penalties (1,000-token histories)"] = median_ms(
        lambda: sampler(logits, penalized, steps, histories), n
    )
    rows["json-schema bitmask (mask + advance)"] = _bitmask_ms(tokenizer_dir, arch, logits, n)

    print(f"{args.model}: vocabulary {vocab:,}, batch {batch}, median of {n} iterations")
    for name, ms in rows.items():
        print(f"  {name:42s} {ms:8.2f} ms")
    settings = {"model": args.model, "vocab": vocab, "batch": batch, "iterations": n}
    path = save_result("vocab_costs", [{"step": k, "median_ms": v} for k, v in rows.items()], settings)
    print(f"saved {path}")


def _real_logits(model, arch, tok: Tokenizer, rows: int) -> torch.Tensor:
    """The model's logits at the last `rows` positions of a real text (peaked like a served request's,
    which decides how far top-p must look)."""
    import inspect

    ids = tok.encode(inspect.getdoc(json) or "")[:256]
    meta = build_attention_metadata([SeqSlice(list(range(len(ids) // 16 + 1)), 0, len(ids))], 16)
    kv = allocate_kv_cache(arch, len(ids) // 16 + 1, 16, model.dtype)
    with torch.inference_mode():
        positions = torch.arange(len(ids) - rows, len(ids))
        return model(torch.tensor(ids), meta.positions, meta, kv, positions).float()


def _bitmask_ms(tokenizer_dir: str, arch, logits: torch.Tensor, iterations: int) -> float:
    """Every row constrained by the JSON schema, each at its own offset into a valid document."""
    tok = Tokenizer(tokenizer_dir)
    eos = tuple(arch.eos_token_ids)
    doc = tok.encode(json.dumps(DOCUMENT), add_special_tokens=False) + list(eos[:1])
    masks = GrammarMasks(tokenizer_dir, arch.vocab_size, eos)
    batch = logits.shape[0]
    ids = [f"r{i}" for i in range(batch)]
    offsets = [i % (len(doc) - 1) for i in range(batch)]
    for i in range(batch):
        masks.add(ids[i], StructuredOutput.json_schema(SCHEMA), doc[: offsets[i]])

    def step() -> None:
        masks.apply(logits, ids)
        masks.advance(ids, [SampledToken(doc[o]) for o in offsets])
        for i in range(batch):
            offsets[i] += 1
            if offsets[i] == len(doc):  # the document is done: a new request starts on this row
                offsets[i] = 0
                masks.remove(ids[i])
                masks.add(ids[i], StructuredOutput.json_schema(SCHEMA), [])

    return median_ms(step, iterations)


if __name__ == "__main__":
    main()
