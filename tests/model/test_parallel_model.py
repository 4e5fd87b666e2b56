"""Tensor- and pipeline-parallel shards: split rules, weight slices, and multi-process runs (gloo on this
host) that must give the single-process model's logits."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from model_harness import SMALL_GEMMA3, SMALL_LLAMA3_SCALED, PagedRunner
from parallel_worker import BLOCK_SIZE, NUM_BLOCKS, make_schedule, run_rank, run_schedule

from sarathi.model import (
    ModelArchConfig,
    ShardSpec,
    TensorParallelGroup,
    allocate_kv_cache,
    kv_cache_bytes_per_block,
    load_model,
    threads_per_rank,
)
from sarathi.model import safetensors_folder as safetensors_module
from sarathi.model.llama import LlamaForCausalLM
from sarathi.model.loader import hf_tensor_shapes, init_dummy_weights
from sarathi.model.safetensors_folder import SafetensorsCheckpoint
from tests.random_checkpoint import write_random_folder

SMOLLM2_SHAPES = {"heads": 9, "kv_heads": 3, "layers": 30, "hidden": 576, "intermediate": 1536}
# Uneven everywhere at tp=2, pp=2: kv heads 2 + 1, q heads 6 + 3, MLP columns 51 + 50, layers 2 + 1.
GQA_UNEVEN: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 72,
    "intermediate_size": 101,
    "num_hidden_layers": 3,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
RANK_TIMEOUT_S = 120
# Sharding changes only the fp32 summation order (split matmuls, all-reduce): measured <= 1e-6 relative.
MAX_REL_DIFF = 1e-5


# --- Split rules ---------------------------------------------------------------------------------------


def _ranges(size: int, fn: str, *args: int) -> list[tuple[int, int]]:
    return [getattr(ShardSpec(tp_rank=r, tp_size=size), fn)(*args) for r in range(size)]


def test_smollm2_tensor_parallel_ranges() -> None:
    s = SMOLLM2_SHAPES
    assert _ranges(2, "kv_head_range", s["kv_heads"]) == [(0, 2), (2, 3)]
    assert _ranges(2, "q_head_range", s["heads"], s["kv_heads"]) == [(0, 6), (6, 9)]
    assert _ranges(2, "column_range", s["intermediate"]) == [(0, 768), (768, 1536)]
    assert _ranges(3, "kv_head_range", s["kv_heads"]) == [(0, 1), (1, 2), (2, 3)]
    assert _ranges(3, "q_head_range", s["heads"], s["kv_heads"]) == [(0, 3), (3, 6), (6, 9)]
    assert _ranges(3, "column_range", s["intermediate"]) == [(0, 512), (512, 1024), (1024, 1536)]
    assert _ranges(3, "column_range", 101) == [(0, 34), (34, 68), (68, 101)]


def test_pipeline_layer_ranges() -> None:
    def stages(layers: int, pp: int) -> list[tuple[int, int]]:
        return [ShardSpec(pp_rank=r, pp_size=pp).layer_range(layers) for r in range(pp)]

    assert stages(30, 2) == [(0, 15), (15, 30)]
    assert stages(30, 3) == [(0, 10), (10, 20), (20, 30)]
    assert stages(30, 4) == [(0, 8), (8, 16), (16, 23), (23, 30)]
    assert stages(3, 2) == [(0, 2), (2, 3)]
    assert stages(3, 3) == [(0, 1), (1, 2), (2, 3)]


def test_layout_and_stage_roles() -> None:
    shards = [ShardSpec(t, 2, p, 3) for p in range(3) for t in range(2)]
    assert [s.rank for s in shards] == list(range(6)) and {s.world_size for s in shards} == {6}
    assert [s.is_first_stage for s in shards] == [True, True, False, False, False, False]
    assert [s.is_last_stage for s in shards] == [False, False, False, False, True, True]
    assert ShardSpec().is_first_stage and ShardSpec().is_last_stage


def test_split_errors_name_both_numbers() -> None:
    with pytest.raises(ValueError, match=r"2 layers into 3 pipeline stages"):
        ShardSpec(pp_size=3).layer_range(2)
    with pytest.raises(ValueError, match=r"3 key/value heads across 4 TP ranks"):
        ShardSpec(tp_size=4).kv_head_range(3)
    with pytest.raises(ValueError, match=r"3 key/value heads across 4 TP ranks"):
        ShardSpec(tp_size=4).q_head_range(9, 3)
    with pytest.raises(ValueError, match=r"3 query heads per kv head across the 2 TP ranks"):
        ShardSpec(tp_size=2).q_head_range(3, 1)


def test_fewer_kv_heads_than_ranks_are_replicated() -> None:
    """Gemma 3 270M: 4 query heads over 1 kv head. Each rank keeps the kv head and its share of queries."""
    shards = [ShardSpec(tp_rank=r, tp_size=2) for r in range(2)]
    assert [s.kv_head_range(1) for s in shards] == [(0, 1), (0, 1)]
    assert [s.q_head_range(4, 1) for s in shards] == [(0, 2), (2, 4)]
    four = [ShardSpec(tp_rank=r, tp_size=4) for r in range(4)]
    assert [s.kv_head_range(2) for s in four] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [s.q_head_range(8, 2) for s in four] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ValueError, match=r"2 columns across 3 TP ranks"):
        ShardSpec(tp_size=3).column_range(2)
    with pytest.raises(ValueError, match=r"tp_rank must be in \[0, 2\), got 2"):
        ShardSpec(tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="pp_size must be >= 1"):
        ShardSpec(pp_size=0)


def test_single_process_helpers() -> None:
    t = torch.ones(3)
    assert TensorParallelGroup().all_reduce(t) is t
    with pytest.raises(RuntimeError, match="needs a tp_group"):
        TensorParallelGroup(None, 2).all_reduce(t)
    assert threads_per_rank(1) >= 1 and threads_per_rank(10**6) == 1
    assert threads_per_rank(2) == max(1, threads_per_rank(1) // 2)


def test_kv_cache_holds_the_shard_only() -> None:
    arch = ModelArchConfig.from_hf_config(GQA_UNEVEN)
    whole = kv_cache_bytes_per_block(arch, 16, torch.float32)
    shards = [ShardSpec(t, 2, p, 2) for p in range(2) for t in range(2)]
    per_shard = [kv_cache_bytes_per_block(arch, 16, torch.float32, s) for s in shards]
    assert sum(per_shard) == whole and per_shard[0] == 2 * 2 * 2 * 16 * 8 * 4  # 2 layers, 2 kv heads, k+v
    kv = allocate_kv_cache(arch, 5, 16, torch.float32, shard=shards[3])  # stage 1 (1 layer), kv head 2
    assert len(kv) == 1 and kv[0][0].shape == (1, 5, 16, 8)


# --- Weight slices -------------------------------------------------------------------------------------


def _expected_slice(full: LlamaForCausalLM, shard: ShardSpec, name: str) -> torch.Tensor:
    """What parameter `name` of a shard must hold, cut from the whole model's parameters."""
    arch, hd = full.arch, full.arch.head_dim
    if name.startswith("layers."):
        _, index, rest = name.split(".", 2)
        name = f"layers.{shard.layer_range(arch.num_hidden_layers)[0] + int(index)}.{rest}"
    w = full.get_parameter(name)
    q0, q1 = shard.q_head_range(arch.num_attention_heads, arch.num_key_value_heads)
    k0, k1 = shard.kv_head_range(arch.num_key_value_heads)
    c0, c1 = shard.column_range(arch.intermediate_size)
    if "qkv_proj" in name:
        kv_rows = arch.num_key_value_heads * hd
        q, k, v = w.split([arch.num_attention_heads * hd, kv_rows, kv_rows])
        return torch.cat([q[q0 * hd : q1 * hd], k[k0 * hd : k1 * hd], v[k0 * hd : k1 * hd]])
    if "gate_up_proj" in name:
        gate, up = w.chunk(2)
        return torch.cat([gate[c0:c1], up[c0:c1]])
    if name.endswith("o_proj.weight"):
        return w[:, q0 * hd : q1 * hd]
    if name.endswith("down_proj.weight"):
        return w[:, c0:c1]
    return w  # norms, embedding, LM head, row-parallel biases: whole


def _assert_shard_of(full: LlamaForCausalLM, part: LlamaForCausalLM, shard: ShardSpec) -> None:
    arch = full.arch
    first, end = shard.layer_range(arch.num_hidden_layers)
    assert len(part.layers) == end - first and part.first_layer == first
    assert (part.embed_tokens is not None) == shard.is_first_stage
    assert (part.lm_head is not None) == (part.norm is not None) == shard.is_last_stage
    names = [n for n, _ in part.named_parameters()]
    if shard.is_last_stage:
        names.append("lm_head.weight")  # tied to the embedding: not listed when both live here
    for name in names:
        assert torch.equal(part.get_parameter(name), _expected_slice(full, shard, name)), name
    if shard.tp_rank > 0 and arch.o_proj_bias:
        assert part.layers[0].self_attn.o_proj.bias is None and part.layers[0].mlp.down_proj.bias is None


SHARDS = [ShardSpec(0, 2, 0, 2), ShardSpec(1, 2, 1, 2), ShardSpec(2, 3, 0, 1), ShardSpec(0, 1, 1, 3)]


@pytest.mark.parametrize("config", [GQA_UNEVEN, SMALL_LLAMA3_SCALED], ids=["gqa-uneven", "llama3-biases"])
def test_shard_weights_are_slices_of_the_whole_model(config: dict[str, Any], tmp_path: Path) -> None:
    arch = write_random_folder(config, tmp_path)
    full = LlamaForCausalLM(arch)
    full.load_hf_weights(SafetensorsCheckpoint(tmp_path).fetch)
    for shard in SHARDS:
        if shard.tp_size <= arch.num_key_value_heads:
            part = LlamaForCausalLM(arch, shard=shard)
            part.load_hf_weights(SafetensorsCheckpoint(tmp_path).fetch)
            _assert_shard_of(full, part, shard)


def test_dummy_shards_are_slices_of_the_whole_dummy_model() -> None:
    arch = ModelArchConfig.from_hf_config(GQA_UNEVEN)
    full = LlamaForCausalLM(arch)
    init_dummy_weights(full, seed=5)
    for shard in SHARDS:
        part = LlamaForCausalLM(arch, shard=shard)
        init_dummy_weights(part, seed=5)
        _assert_shard_of(full, part, shard)


def test_slice_of_a_tensor_larger_than_the_config_says_is_refused(tmp_path: Path) -> None:
    """A sliced read cannot see a shape mismatch in its own result, so it checks the full tensor's shape."""
    write_random_folder({**GQA_UNEVEN, "intermediate_size": 104}, tmp_path)
    arch = ModelArchConfig.from_hf_config(GQA_UNEVEN)  # says 101
    part = LlamaForCausalLM(arch, shard=ShardSpec(tp_rank=1, tp_size=2))
    with pytest.raises(ValueError, match=r"gate_proj\.weight.* shape \(104, 72\), expected 101 along dim 0"):
        part.load_hf_weights(SafetensorsCheckpoint(tmp_path).fetch)


_REAL_SAFE_OPEN = safetensors_module.safe_open


class _SpyHandle:
    """A safetensors file handle that records which tensors are read whole and which as slices."""

    def __init__(self, handle: Any, log: dict[str, list[str]]) -> None:
        self.handle, self.log = handle, log

    def __enter__(self) -> _SpyHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.__exit__(*exc)

    def keys(self) -> list[str]:
        return self.handle.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        self.log["whole"].append(name)
        return self.handle.get_tensor(name)

    def get_slice(self, name: str) -> Any:
        self.log["sliced"].append(name)
        return self.handle.get_slice(name)


def _reads(folder: Path, shard: ShardSpec, monkeypatch) -> dict[str, list[str]]:
    """Names of the tensors loading `shard` reads whole and as slices."""
    log: dict[str, list[str]] = {"whole": [], "sliced": []}
    spy = lambda *args, **kw: _SpyHandle(_REAL_SAFE_OPEN(*args, **kw), log)  # noqa: E731
    monkeypatch.setattr(safetensors_module, "safe_open", spy)
    load_model(str(folder), shard=shard)
    return log


def test_sharded_load_reads_slices_only(tmp_path: Path, monkeypatch) -> None:
    arch = write_random_folder(SMALL_LLAMA3_SCALED, tmp_path)
    whole = _reads(tmp_path, ShardSpec(), monkeypatch)
    assert whole["sliced"] == [] and sorted(whole["whole"]) == sorted(hf_tensor_shapes(arch))

    log = _reads(tmp_path, ShardSpec(tp_rank=1, tp_size=2, pp_rank=1, pp_size=2), monkeypatch)
    layer = "model.layers.2."  # stage 1 of 2 holds only layer 2
    column_parallel = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
    )
    row_parallel = ("self_attn.o_proj", "mlp.down_proj")
    expected = {f"{layer}{p}.{s}" for p in column_parallel for s in ("weight", "bias")}
    expected |= {f"{layer}{p}.weight" for p in row_parallel}  # tp rank 1 has no row-parallel bias
    assert sorted(log["sliced"]) == sorted(expected)
    # Whole: the LM head (tied: the embedding tensor), the final norm and the layer's norms.
    norms = [f"{layer}input_layernorm.weight", f"{layer}post_attention_layernorm.weight"]
    assert sorted(log["whole"]) == sorted(["model.embed_tokens.weight", "model.norm.weight", *norms])


# --- Multi-process runs --------------------------------------------------------------------------------


def _run_ranks(
    tp: int, pp: int, model: str | None, load_kwargs: dict[str, Any], schedule, out_dir: Path
) -> dict[int, torch.Tensor]:
    """Spawn tp * pp ranks over gloo; the logits each last-stage rank saved, by global rank."""
    out_dir.mkdir(parents=True)
    init_method = f"file://{out_dir / 'rendezvous'}"
    ctx = multiprocessing.get_context("spawn")
    shards = [ShardSpec(t, tp, p, pp) for p in range(pp) for t in range(tp)]
    procs = [
        ctx.Process(
            target=run_rank, args=(s, init_method, model, load_kwargs, schedule, out_dir), daemon=True
        )
        for s in shards
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + RANK_TIMEOUT_S
    try:
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    errors = "\n".join(p.read_text() for p in sorted(out_dir.glob("error_rank*.txt")))
    codes = [proc.exitcode for proc in procs]
    assert codes == [0] * len(procs), f"exit codes {codes} (None: timed out)\n{errors}"
    return {s.rank: torch.load(out_dir / f"logits_rank{s.rank}.pt") for s in shards if s.is_last_stage}


def _single_process_logits(model: str | None, load_kwargs: dict[str, Any], schedule) -> torch.Tensor:
    net, arch, _ = load_model(model, **load_kwargs)
    return run_schedule(PagedRunner(net, arch, BLOCK_SIZE, NUM_BLOCKS), schedule)


def _check_against_single_process(
    tp: int, pp: int, model: str | None, load_kwargs: dict[str, Any], vocab_size: int, out_dir: Path
) -> None:
    schedule = make_schedule(vocab_size)
    ref = _single_process_logits(model, load_kwargs, schedule)
    by_rank = _run_ranks(tp, pp, model, load_kwargs, schedule, out_dir)
    assert len(by_rank) == tp
    first, *others = by_rank.values()
    for other in others:  # TP replicas of the LM head see identical all-reduced inputs
        assert torch.equal(other, first)
    assert first.shape == ref.shape == (sum(len(t) for step in schedule for _, t, _ in step), vocab_size)
    rel = ((first - ref).abs().max() / ref.abs().max()).item()
    print(f"tp={tp} pp={pp}: max |sharded - single| / max |single| = {rel:.3g}")
    assert rel <= MAX_REL_DIFF, f"{rel:.3g}"


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2), (2, 2)], ids=["tp2", "pp2", "tp2-pp2"])
def test_dummy_gqa_uneven_matches_single_process(tp: int, pp: int, tmp_path: Path) -> None:
    kwargs = {"load_format": "dummy", "hf_config": GQA_UNEVEN, "seed": 3}
    _check_against_single_process(tp, pp, None, kwargs, GQA_UNEVEN["vocab_size"], tmp_path / "ranks")


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_gemma3_sliding_window_matches_single_process(tp: int, pp: int, tmp_path: Path) -> None:
    """Gemma 3 at window 4 (the schedule's sequences reach 14 tokens): its one kv head replicated on both TP
    ranks, sliding and global layers split over stages."""
    write_random_folder({**SMALL_GEMMA3, "sliding_window": 4}, tmp_path / "model")
    vocab = SMALL_GEMMA3["vocab_size"]
    _check_against_single_process(tp, pp, str(tmp_path / "model"), {}, vocab, tmp_path / "ranks")


@pytest.mark.parametrize(("tp", "pp"), [(2, 2), (1, 3)], ids=["tp2-pp2", "pp3"])
def test_safetensors_with_biases_matches_single_process(tp: int, pp: int, tmp_path: Path) -> None:
    """Realistic-scale weights, q/k/v, o and MLP biases, tied embeddings across stages; pp=3 has a middle
    stage that both receives and sends."""
    write_random_folder(SMALL_LLAMA3_SCALED, tmp_path / "model")
    vocab = SMALL_LLAMA3_SCALED["vocab_size"]
    _check_against_single_process(tp, pp, str(tmp_path / "model"), {}, vocab, tmp_path / "ranks")
