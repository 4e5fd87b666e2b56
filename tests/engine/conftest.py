"""Shared fixtures for engine tests that run the embedded SmolLM2-135M model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from sarathi.model import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from sarathi.tokenizer import Tokenizer

    return Tokenizer(smollm2_path)
