"""Gemma 3 270M's logits against transformers fp32 on the same dequantized weights, in every precision we
serve, held to SmolLM2's bounds (test_model_vs_hf): fp32 max |error| <= 3e-4, bf16 <= 1e-2 relative, bf16
math <= 1.5e-2 relative. The 640-token prompt crosses the sliding layers' 512-token window, in chunks of
64 (each reading the cache) and as one prefill. Measured on a Zen4: fp32 2.3e-4 max abs (1.3e-6 relative,
logits up to |56|), bf16 4.3e-3, bf16 math 5.5e-3. Served from the GGUF's own quantized blocks (Q5_0, Q4_K,
Q6_K, Q8_0; bf16 activations) it is held to the quantization contract, 1.5e-2 (measured 4.0e-3 / 3.8e-3).
"""

from __future__ import annotations

import pytest
import torch
from model_harness import PagedRunner, max_abs_err, rel_err

from sarathi.model import kernels, load_model
from sarathi.model.embedded import packaged_model_path
from sarathi.model.loader import resolve_compute_dtype

PROMPT_LEN, CHECKED_ROWS = 640, 96  # the last 96 positions all see a window cut at 512
BOUNDS = {
    (torch.float32, torch.float32): ("max_abs", 3e-4),
    (torch.bfloat16, torch.float32): ("rel", 1e-2),
    (torch.bfloat16, torch.bfloat16): ("rel", 1.5e-2),
    "gguf": ("rel", 1.5e-2),
}


@pytest.fixture(scope="module")
def folder() -> str:
    return packaged_model_path("gemma3-270m")


@pytest.fixture(scope="module")
def prompt(folder) -> list[int]:
    import inspect
    import json
    import logging

    from sarathi.tokenizer import Tokenizer

    text = "\n\n".join(inspect.getdoc(m) or "" for m in (logging, json))
    tokens = Tokenizer(folder).encode(text)
    assert len(tokens) >= PROMPT_LEN
    return tokens[:PROMPT_LEN]


@pytest.fixture(scope="module")
def reference(folder, prompt) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.inference_mode():  # the LM head over the checked rows only: 262k columns a row
        return hf(torch.tensor([prompt]), logits_to_keep=CHECKED_ROWS).logits[0].float()


@pytest.fixture(scope="module")
def models(folder) -> dict:
    """Our model per precision, loaded once."""
    served = {"dtype": torch.bfloat16, "compute_dtype": resolve_compute_dtype(torch.bfloat16, "auto")}
    return {
        p: load_model("gemma3-270m", **served, quantization="gguf")[:2]
        if p == "gguf"
        else load_model(folder, dtype=p[0], compute_dtype=p[1])[:2]
        for p in BOUNDS
    }


@pytest.mark.parametrize("chunk", [64, PROMPT_LEN])
@pytest.mark.parametrize("precision", list(BOUNDS), ids=["fp32", "bf16", "bf16-math", "gguf"])
def test_gemma3_logits_match_transformers(models, prompt, reference, precision, chunk) -> None:
    if precision == (torch.bfloat16, torch.bfloat16) and chunk == PROMPT_LEN and not kernels.available():
        # Without our bf16 kernel (no AVX512-BF16: a Zen3, older Xeons) bf16 math is not served by default
        # and torch's bf16 matmul is emulated, ~30 s a case on a 2-core Zen3; chunk 64 still checks it.
        pytest.skip("bf16 math in one prefill is checked where our bf16 kernel runs")
    model, arch = models[precision]
    runner = PagedRunner(model, arch, block_size=16, num_blocks=48)
    logits = runner.prefill("a", prompt, chunk=chunk)[-CHECKED_ROWS:]
    kind, bound = BOUNDS[precision]
    err = max_abs_err(logits, reference) if kind == "max_abs" else rel_err(logits, reference)
    print(f"gemma3 {precision} chunk {chunk}: {kind} {err:.3g}")
    assert err <= bound, f"{kind} error {err:.3g} > {bound}"
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.95
