"""GrammarMasks: masks only constrained rows, advances with sampled tokens, and a matcher rebuilt from a
request's outputs (readmission after preemption) masks exactly like the one that lived through them."""

from __future__ import annotations

import torch

from sarathi.engine.step_messages import SampledToken
from sarathi.model import embedded_model_path
from sarathi.structured_output import StructuredOutput
from sarathi.tokenizer import Tokenizer
from sarathi.worker.grammar_masks import GrammarMasks

VOCAB = 49152


def test_masks_follow_the_grammar_and_replay_after_preemption():
    folder = str(embedded_model_path())
    tok = Tokenizer(folder)
    eos = (tok.eos_token_id,)
    masks = GrammarMasks(folder, VOCAB, eos)
    logits = torch.zeros(2, VOCAB)
    # No constrained request: the logits come back untouched, not even copied.
    assert masks.apply(logits, ["free", "other"])[0] is logits

    masks.add("r", StructuredOutput.choice(["yes", "no"]), [])
    out, failed = masks.apply(logits, ["free", "r"])
    assert not failed and torch.isfinite(out[0]).all()
    allowed = torch.isfinite(out[1]).nonzero().flatten().tolist()
    assert all(tok.decode([t]) in ("y", "ye", "yes", "n", "no") for t in allowed) and allowed
    target = tok.encode("yes", add_special_tokens=False)
    masks.advance(["r"], [SampledToken(target[0])])
    live = masks.apply(logits[:1], ["r"])[0]

    replayed = GrammarMasks(folder, VOCAB, eos)
    replayed.add("r", StructuredOutput.choice(["yes", "no"]), target[:1])
    assert torch.equal(replayed.apply(logits[:1], ["r"])[0], live)
    for t in target[1:]:
        masks.advance(["r"], [SampledToken(t)])
    done = masks.apply(logits[:1], ["r"])[0]
    assert torch.isfinite(done[0]).nonzero().flatten().tolist() == list(eos)  # complete: only EOS


def test_a_matcher_that_cannot_be_built_fails_its_row_only():
    masks = GrammarMasks(None, VOCAB, (0,))
    masks.add("r", StructuredOutput("regex", "a+"), [])
    _, failed = masks.apply(torch.zeros(2, VOCAB), ["free", "r"])
    assert list(failed) == [1] and "tokenizer" in failed[1]
