"""Command-line entry point and flag parsing."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields

import pytest

from sarathi.config import ChunkSchedule, EngineConfig, SchedulerConfig, engine_config, keyword, knob
from sarathi.entrypoints.args import (
    NOT_FLAGS,
    add_config_args,
    add_engine_args,
    config_args,
    engine_config_from_args,
)
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
    assert (default.model.dtype, default.model.compute_dtype, default.model.quantization) == (
        "auto",
        "auto",
        "auto",
    )
    assert default.model.storage_dtype == "bfloat16"
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


def _sections() -> list[type]:
    return [s.default_factory for s in fields(EngineConfig)]


def test_every_config_field_is_a_flag_with_help_or_deliberately_not():
    parser = add_engine_args(argparse.ArgumentParser())
    helps = {a.help for a in parser._actions}
    defaults = parser.parse_args([])
    for cls in [*_sections(), ChunkSchedule]:
        flags = config_args(defaults, cls)  # reads every knob's flag: AttributeError if one is missing
        for f in fields(cls):
            if f.name in NOT_FLAGS:
                assert "argparse" not in f.metadata
                continue
            help = f.metadata.get("argparse", {}).get("help")
            assert help and help in helps, f"{cls.__name__}.{f.name} has no flag with help"
            assert flags[keyword(f)] == (None if f.default is MISSING else f.default)
    keywords = [keyword(f) for cls in _sections() for f in fields(cls)]
    assert len(keywords) == len(set(keywords)), "an engine_config keyword must name one field"


def test_a_new_knob_field_is_a_flag_end_to_end():
    @dataclass(frozen=True)
    class Demo:
        demo_knob: int = knob(3, "a made-up knob", type=int)
        renamed: str = knob("a", "picks a letter", flags=("--letter", "-l"), choices=("a", "b"))
        plain: float = 0.5

    parser = argparse.ArgumentParser()
    add_config_args(parser, Demo)
    assert "a made-up knob" in parser.format_help() and "--plain" not in parser.format_help()
    assert Demo(**config_args(parser.parse_args([]), Demo)) == Demo()
    assert Demo(**config_args(parser.parse_args(["--demo-knob", "7", "-l", "b"]), Demo)) == Demo(7, "b")
    with pytest.raises(SystemExit):
        parser.parse_args(["--letter", "c"])


def test_engine_config_keywords_come_from_the_fields():
    c = engine_config("m.gguf", scheduler="orca", kv_cache_memory_gib=1.5, tensor_parallel_size=2)
    assert (c.model.model, c.scheduler.name, c.cache.kv_cache_memory_gib) == ("m.gguf", "orca", 1.5)
    assert c.parallel.tensor_parallel_size == 2 and c.scheduler.token_budget == SchedulerConfig().token_budget
    with pytest.raises(TypeError, match="unexpected keyword arguments: name"):
        engine_config(name="orca")


def test_a_gguf_model_is_served_in_its_own_quantization_by_default():
    from sarathi.model import kernels
    from sarathi.model.loader import effective_quantization

    own = "gguf" if kernels.portable_available() else "none"
    assert effective_quantization(_config().model) == own  # the embedded model's shipped file
    assert effective_quantization(_config("--model", "gemma3-270m").model) == own
    assert effective_quantization(_config("--model", "/models/x.gguf").model) == own
    assert effective_quantization(_config("--dtype", "bfloat16").model) == "none"  # dequantized, as before
    assert effective_quantization(_config("--dtype", "float32").model) == "none"
    assert effective_quantization(_config("--compute-dtype", "float32").model) == "none"
    assert effective_quantization(_config("--model", "/models/hf-folder").model) == "none"
    assert effective_quantization(_config("--quantization", "int8", "--model", "/models/hf").model) == "int8"
    with pytest.raises(ValueError, match="needs dtype 'bfloat16'"):
        _config("--quantization", "gguf", "--dtype", "float32")
