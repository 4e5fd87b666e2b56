"""Command-line entry point and flag parsing."""

from __future__ import annotations

import argparse

import pytest

from sarathi.entrypoints.args import add_engine_args, engine_config_from_args
from sarathi.entrypoints.cli import main


def _config(*flags: str):
    return engine_config_from_args(add_engine_args(argparse.ArgumentParser()).parse_args(list(flags)))


def test_flags_map_to_the_engine_config():
    c = _config(
        "--scheduler", "vllm", "--token-budget", "64", "--num-kv-blocks", "100", "--dtype", "bfloat16"
    )
    assert (c.scheduler.name, c.scheduler.token_budget, c.cache.num_kv_blocks, c.model.dtype) == (
        "vllm",
        64,
        100,
        "bfloat16",
    )
    assert c.scheduler.chunk_schedule is None
    assert c.model.compute_dtype == "auto"
    default = _config()
    assert (default.model.dtype, default.model.compute_dtype) == ("bfloat16", "auto")
    fast = _config("--dtype", "bfloat16", "--compute-dtype", "bfloat16")
    assert (fast.model.dtype, fast.model.compute_dtype) == ("bfloat16", "bfloat16")
    dyn = _config("--token-budget", "256", "--low-chunk-size", "32", "--chunk-schedule-stages", "3")
    assert dyn.scheduler.chunk_schedule.chunk_sizes == [256, 144, 32]


def test_prefix_caching_is_on_unless_turned_off():
    assert _config().cache.enable_prefix_caching
    assert not _config("--no-enable-prefix-caching").cache.enable_prefix_caching
    assert _config("--enable-prefix-caching").cache.enable_prefix_caching


def test_bad_flag_values_are_named():
    with pytest.raises(ValueError, match="unknown scheduler 'fifo'; choose one of: sarathi, vllm"):
        _config("--scheduler", "fifo")
    with pytest.raises(ValueError, match="give either num_kv_blocks or kv_cache_memory_gib"):
        _config("--num-kv-blocks", "10", "--kv-cache-memory", "1")
    with pytest.raises(ValueError, match="compute_dtype 'bfloat16' needs dtype 'bfloat16'"):
        _config("--dtype", "float32", "--compute-dtype", "bfloat16")


def test_generate_command_prints_the_answer(capsys):
    rc = main(
        [
            "generate",
            "--chat",
            "What is the capital of France?",
            "--max-tokens",
            "16",
            "--num-kv-blocks",
            "64",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "Paris" in out and "TTFT p50" in out


def test_generate_command_rejects_bad_sampling(capsys):
    assert main(["generate", "hi", "--top-p", "0", "--num-kv-blocks", "8"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err
