"""Incremental detokenization: the byte-level path (per-token bytes through an incremental UTF-8 decoder)
against the tokenizer's own decode of the whole output, on the embedded model's tokenizer."""

from __future__ import annotations

import os
import random

import pytest

from sarathi.tokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! The three primary colors are red, yellow and blue.",
    "naïve café — 東京タワー 🗼🚀 ½ ∑ x² ≠ y³",
    "  leading spaces\n\ttabs\r\nand 12345.678 numbers",
    "emoji split across tokens: 👩‍👩‍👧‍👦 🏳️‍🌈",
]


def feed(detok: IncrementalDetokenizer, ids: list[int]) -> str:
    return "".join(detok.add([t]) for t in ids)


def test_loading_a_tokenizer_leaves_the_process_hub_settings_alone(smollm2_path, monkeypatch):
    """The tokenizer reads its local folder only; it does not switch the whole process offline."""
    from sarathi.tokenizer import Tokenizer

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert Tokenizer(smollm2_path).encode("Hello") and "HF_HUB_OFFLINE" not in os.environ


def test_the_embedded_tokenizer_takes_the_byte_level_path(smollm2_tokenizer):
    table = smollm2_tokenizer.decode_bytes
    assert table is not None and len(table) == smollm2_tokenizer.vocab_size
    assert all(table[i] == b"" for i in smollm2_tokenizer._tok.all_special_ids)


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_deltas_join_to_the_tokenizer_decode(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("Say:", add_special_tokens=False)
    fast = IncrementalDetokenizer(tok, prompt)
    assert fast._bytes is not None
    deltas = [fast.add([t]) for t in ids]
    assert "".join(deltas) == fast.text == tok.decode(ids) == text
    assert "\ufffd" not in "".join(deltas)  # partial characters are held back, never emitted broken
    slow = IncrementalDetokenizer(tok, prompt)
    slow._bytes = None  # the windowed path other tokenizers take
    assert feed(slow, ids) == text


def test_random_ids_with_special_tokens_decode_like_the_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    rng = random.Random(0)
    specials = tok._tok.all_special_ids
    for _ in range(50):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        ids += rng.sample(specials, k=min(2, len(specials)))
        rng.shuffle(ids)
        detok = IncrementalDetokenizer(tok, [])
        text = feed(detok, ids)
        full = tok.decode(ids, skip_special_tokens=True)
        # a random id sequence may end inside a UTF-8 character: that tail is held back
        assert full.startswith(text) and set(full[len(text) :]) <= {"\ufffd"}
