"""GGUF types with sub-blocks of 16 (Q2_K and Q3_K, as 2- and 3-bit codes) or table indices (IQ4_NL, IQ4_XS;
see sarathi/model/quantized.py), served from a whole file: the embedded SmolLM2's GGUF with six layers
re-encoded the way llama-quantize's Q2_K, Q3_K_M and IQ4_XS files mix them where 576 columns do not fill
256-weight blocks (IQ4_NL for those, Q3_K, IQ4_XS and Q2_K for the down projections). Logits against our
float32 model on the same file's dequantized weights (which matches transformers fp32 within 3e-4:
test_model_vs_hf) within the quantization contract, in every chunking; each layer's weights resident at the
stated multiple of the file's bytes (IQ4's: the file's own bytes)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_requantize import encode, requantized_copy
from model_harness import PagedRunner, rel_err

from sarathi.model import kernels, load_model
from sarathi.model.embedded import embedded_gguf_path
from sarathi.model.linear import Linear
from sarathi.model.loader import resolve_compute_dtype
from sarathi.model.quantized import WIDENED

pytestmark = pytest.mark.skipif(
    not kernels.portable_available(), reason="sarathi's CPU kernels do not run here"
)

CONTRACT_REL = 1.5e-2
TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
    "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
)


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"])
def test_encoder_blocks_decode_near_their_input(qtype) -> None:
    """The test's own encoder writes the layout the `gguf` package reads (else the file below would hold
    noise): every weight comes back within its block's step."""
    w = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32) * 0.05
    blocks = encode(w, qtype)
    back = np.asarray(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])).reshape(w.shape)
    # Q2_K's step is a third of a 16's range, Q3_K's max / 4 per 16; IQ4's table steps up to 24 / 127 of max
    bound = {"Q2_K": 0.3, "Q3_K": 0.16, "IQ4_NL": 0.11, "IQ4_XS": 0.12}[qtype]
    assert np.abs(back - w).max() <= bound * np.abs(w).max()
    assert np.corrcoef(back.ravel(), w.ravel())[0, 1] > 0.95


def _choose(name: str, shape: tuple[int, int]) -> str | None:
    layer = name.split(".")[1] if name.startswith("blk.") else None
    if layer is None or int(layer) >= 6:
        return None
    if name.endswith("ffn_down.weight"):
        return ("Q3_K", "IQ4_XS", "Q2_K")[int(layer) % 3]
    return "IQ4_NL"


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("requantized") / "smollm2-mixed.gguf"
    requantized_copy(embedded_gguf_path(), path, _choose)
    return str(path)


@pytest.fixture(scope="module")
def prompt_and_reference(mixed_file):
    from transformers import AutoTokenizer

    from sarathi.model import embedded_model_path

    prompt = AutoTokenizer.from_pretrained(embedded_model_path())(TEXT)["input_ids"]
    ref_model, arch, _ = load_model(mixed_file, dtype=torch.float32, compute_dtype=torch.float32)
    runner = PagedRunner(ref_model, arch, block_size=16, num_blocks=16)
    return prompt, runner.prefill("a", prompt, chunk=10_000)


@pytest.fixture(scope="module")
def served(mixed_file):
    compute = resolve_compute_dtype(torch.bfloat16, "auto")
    return load_model(mixed_file, dtype=torch.bfloat16, compute_dtype=compute, quantization="gguf")[:2]


def test_the_file_is_served_in_its_own_types(served) -> None:
    model, _ = served
    assert {"Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "Q4_1"} <= model.quantized_layers().keys()
    assert not [n for n, m in model.named_modules() if isinstance(m, Linear) and not m.quantized_formats]


@pytest.mark.parametrize("chunk", [1, 16, 10_000])
def test_logits_within_the_contract(served, prompt_and_reference, chunk) -> None:
    model, arch = served
    prompt, reference = prompt_and_reference
    logits = PagedRunner(model, arch, block_size=16, num_blocks=16).prefill("a", prompt, chunk=chunk)
    err = rel_err(logits, reference)
    print(f"mixed Q2_K / Q3_K / IQ4 file, chunk {chunk}: relative error {err:.3g}")
    assert err <= CONTRACT_REL
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.95


def test_widened_weights_take_the_stated_multiple_of_the_file_bytes(served, mixed_file) -> None:
    model, _ = served
    file_bytes = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(mixed_file).tensors}
    down = model.layers[0].mlp.down_proj
    assert down.quantized_formats == ["Q3_K"]
    stated = WIDENED["Q3_K"][1] * file_bytes["blk.0.ffn_down.weight"]
    assert abs(down.weight_bytes - stated) <= 0.05 * stated
    down = model.layers[2].mlp.down_proj
    stated = WIDENED["Q2_K"][1] * file_bytes["blk.2.ffn_down.weight"]
    assert abs(down.weight_bytes - stated) <= 0.05 * stated


def test_iq4_weights_take_the_file_bytes(served, mixed_file) -> None:
    """IQ4_XS's and IQ4_NL's indices are kept as 4 bits (looked up in the kernels): the resident bytes are the
    file's (the output rows here fill whole tiles of 16), but for IQ4_XS's 6-bit sub-block multipliers, held
    as bytes: 138 bytes per 256 weights against the file's 136."""
    model, _ = served
    file_bytes = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(mixed_file).tensors}
    down = model.layers[1].mlp.down_proj
    assert down.quantized_formats == ["IQ4_XS"]
    assert down.weight_bytes * 136 == file_bytes["blk.1.ffn_down.weight"] * 138
    attn = model.layers[0].self_attn
    for proj, parts in ((attn.qkv_proj, ("attn_q", "attn_k", "attn_v")), (attn.o_proj, ("attn_output",))):
        assert set(proj.quantized_formats) == {"IQ4_NL"}
        assert proj.weight_bytes == sum(file_bytes[f"blk.0.{part}.weight"] for part in parts)
