"""benchmarks/llama_cpp_kernels.py's parsing of llama-bench's JSON and llama-batched-bench's JSONL, and the
command lines it builds. The texts have the shape llama.cpp prints (log lines around the results); no
llama.cpp runs here, and no number below stands in for a measurement."""

from __future__ import annotations

import json

import pytest

from benchmarks import llama_cpp_kernels as lk

LLAMA_BENCH_JSON = [
    {"n_prompt": 64, "n_gen": 0, "n_depth": 0, "avg_ns": 31_250_000, "avg_ts": 2048.0},
    {"n_prompt": 0, "n_gen": 32, "n_depth": 512, "avg_ns": 300_000_000, "avg_ts": 106.7},
]


def test_parse_llama_bench_keeps_prompt_only_tests_in_ms():
    text = "build: something\n" + json.dumps(LLAMA_BENCH_JSON, indent=2)
    assert lk.parse_llama_bench(text) == {64: pytest.approx(31.25)}


def test_parse_batched_bench_ms_per_step_among_log_lines():
    rows = [
        {"pp": 512, "tg": 16, "pl": 1, "n_kv": 528, "t_pp": 0.2, "t_tg": 0.16, "speed_tg": 100.0},
        {"pp": 512, "tg": 16, "pl": 32, "n_kv": 16896, "t_pp": 8.0, "t_tg": 1.28, "speed_tg": 400.0},
    ]
    text = "main: n_kv_max = 16896\n" + "\n".join(json.dumps(r) for r in rows) + "\nllama_perf: done\n"
    assert lk.parse_batched_bench(text) == {1: pytest.approx(10.0), 32: pytest.approx(80.0)}


def test_commands_use_the_shapes_and_threads(monkeypatch):
    seen = []

    def fake_run(cmd, max_foreign, tries=3):
        seen.append(cmd)
        if "-npl" in cmd:
            b = int(cmd[cmd.index("-npl") + 1])
            return json.dumps({"pp": 512, "tg": lk.DECODE_STEPS, "pl": b, "t_tg": 0.32}), 0.01
        t = int(cmd[cmd.index("-p") + 1])
        return json.dumps([{"n_prompt": t, "n_gen": 0, "avg_ns": 1e6 * t}]), 0.02

    monkeypatch.setattr(lk, "run_guarded", fake_run)
    pre = lk.prefill_times("bench", "m.gguf", [16, 256], threads=2, reps=3, max_foreign=0.08)
    assert [(p.case, p.ms) for p in pre] == [("prefill T=16", 16.0), ("prefill T=256", 256.0)]
    cmd = seen[1]
    assert [cmd[cmd.index(f) + 1] for f in ("-t", "-p", "-n", "-b", "-ub", "-r")] == [
        "2", "256", "0", "256", "256", "3",
    ]  # fmt: skip
    dec = lk.decode_times("bb", "m.gguf", [32], context=512, threads=2, reps=2, max_foreign=0.08)
    assert dec[0].case == "decode B=32" and dec[0].ms == pytest.approx(20.0) and dec[0].foreign_load == 0.01
    cmd = seen[-1]
    assert [cmd[cmd.index(f) + 1] for f in ("-npp", "-ntg", "-npl", "-c")] == [
        "512", str(lk.DECODE_STEPS), "32", str(32 * (512 + lk.DECODE_STEPS)),
    ]  # fmt: skip
    assert len(seen) == 2 + 2  # two prefill shapes, and the decode run repeated reps times


def test_a_tool_that_crashes_with_repacking_on_runs_again_without_it(monkeypatch):
    """llama.cpp's AMX matmul segfaults on some Xeons: the tool runs again with repacking off, and later calls
    on that file go there at once; the recorded command carries the flag."""
    seen = []

    def fake_run(cmd, max_foreign, tries=3):
        seen.append(cmd)
        if "--repack" not in cmd and "--no-repack" not in cmd:
            raise lk.LlamaCppCrashed(f"{cmd[0]} crashed (signal 11) on m.gguf")
        if "-npl" in cmd:
            return json.dumps({"pp": 512, "tg": lk.DECODE_STEPS, "pl": 1, "t_tg": 0.32}), 0.0
        t = int(cmd[cmd.index("-p") + 1])
        return json.dumps([{"n_prompt": t, "n_gen": 0, "avg_ns": 1e6 * t}]), 0.0

    monkeypatch.setattr(lk, "run_guarded", fake_run)
    monkeypatch.setattr(lk, "_crashed", set())
    pre = lk.prefill_times("llama-bench", "m.gguf", [16, 64], threads=2, reps=1, max_foreign=0.08)
    assert [p.ms for p in pre] == [16.0, 64.0]
    assert all(p.command.endswith("--repack 0") for p in pre)
    assert len(seen) == 3  # one crash, then straight to the flag
    dec = lk.decode_times(
        "llama-batched-bench", "m.gguf", [1], context=512, threads=2, reps=2, max_foreign=0.08
    )
    assert dec[0].command.endswith("--no-repack") and dec[0].ms == pytest.approx(20.0)
    assert len(seen) == 3 + 1 + 2


def test_a_crash_is_told_from_an_error(tmp_path):
    crash = tmp_path / "crash"
    crash.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crash.chmod(0o755)
    with pytest.raises(lk.LlamaCppCrashed, match="signal 11"):
        lk.run_guarded([str(crash), "-m", "m.gguf"], max_foreign=1.0)
    fail = tmp_path / "fail"
    fail.write_text("#!/bin/sh\necho bad >&2\nexit 1\n")
    fail.chmod(0o755)
    with pytest.raises(RuntimeError, match="failed") as info:
        lk.run_guarded([str(fail), "-m", "m.gguf"], max_foreign=1.0)
    assert not isinstance(info.value, lk.LlamaCppCrashed)
