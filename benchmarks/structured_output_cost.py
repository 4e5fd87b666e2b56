"""Per-iteration cost of structured-output masks at a batch of running requests (default 32).

For each mix (none / half / all rows constrained by a JSON schema) every iteration does what the
sampling worker does: ``GrammarMasks.apply`` (compute each constrained row's bitmask, unpack it, mask the
logits) and ``advance`` (each matcher consumes its row's token). Tokens follow valid JSON documents, each
row at its own offset, so matchers see realistic states. Prints ms per iteration.

    OMP_NUM_THREADS=1 python -m benchmarks.structured_output_cost [--batch 32] [--iterations 200]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sarathi.engine.step_messages import SampledToken
from sarathi.model import embedded_model_path
from sarathi.structured_output import StructuredOutput
from sarathi.tokenizer import Tokenizer
from sarathi.worker.grammar_masks import GrammarMasks

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "active"],
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["math", "poetry"],
    "active": True,
}


def run(batch: int, constrained: int, iterations: int, tok: Tokenizer, folder: str) -> float:
    vocab, eos = 49152, (tok.eos_token_id,)
    text = json.dumps(DOCUMENT, separators=(", ", ": "))
    doc = tok.encode(text, add_special_tokens=False) + list(eos)
    masks = GrammarMasks(folder, vocab, eos)
    ids = [f"r{i}" for i in range(batch)]
    offsets = [i % len(doc) for i in range(batch)]
    for i in range(constrained):
        masks.add(ids[i], StructuredOutput.json_schema(SCHEMA), doc[: offsets[i]])
    logits = torch.randn(batch, vocab)
    elapsed = 0.0
    for _ in range(iterations):
        start = time.perf_counter()
        masks.apply(logits, ids)
        sampled = [SampledToken(doc[o]) for o in offsets]
        masks.advance(ids, sampled)
        elapsed += time.perf_counter() - start
        for i in range(batch):
            offsets[i] += 1
            if offsets[i] == len(doc):  # document done: the request finishes, a new one starts
                offsets[i] = 0
                if i < constrained:
                    masks.add(ids[i], StructuredOutput.json_schema(SCHEMA), [])
    return 1e3 * elapsed / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    folder = str(embedded_model_path())
    tok = Tokenizer(folder)
    GrammarMasks(folder, 49152, (0,))._llg_tokenizer()  # warm-up: the tokenizer is built once per worker
    for constrained in (0, args.batch // 2, args.batch):
        ms = run(args.batch, constrained, args.iterations, tok, folder)
        print(f"batch {args.batch}, {constrained:3d} constrained: {ms:.3f} ms per iteration (mask + advance)")


if __name__ == "__main__":
    main()
