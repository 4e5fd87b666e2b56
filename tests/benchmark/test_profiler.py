"""``sarathi profile``: the timing harness over real batches of the embedded model, its files and its CLI."""

from __future__ import annotations

import csv
import math

import pytest

from sarathi.benchmark.profile_plots import plot_profile
from sarathi.benchmark.profiler import (
    CSV_COLUMNS,
    GridPoint,
    grid_points,
    measure_decode_iteration_time,
    profile_grid,
    read_csv,
    time_point,
    write_csv,
)
from sarathi.config import engine_config
from sarathi.engine.llm_engine import LLMEngine
from sarathi.entrypoints.build import build_engine
from sarathi.entrypoints.cli import main

NUM_KV_BLOCKS = 256  # of 16 tokens


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return build_engine(engine_config(num_kv_blocks=NUM_KV_BLOCKS))


def test_grid_points_skip_the_empty_batch():
    points = grid_points([0, 8], [0, 2], [8, 24])
    assert len(points) == 6
    assert GridPoint(0, 0, 8) not in points
    assert [p.num_tokens for p in points[:3]] == [2, 8, 10]


def test_tiny_grid_writes_csv_and_plot_and_frees_every_block(engine, tmp_path):
    points = grid_points([0, 8], [0, 2], [8, 24])
    results = profile_grid(engine, points, repeats=2, warmup=0)
    assert engine.block_manager.num_used_blocks == 0
    assert {r.kind for r in results} == {"prefill", "decode", "mixed"}
    for r in results:
        assert all(math.isfinite(x) and x > 0 for x in (r.p10_ms, r.median_ms, r.p90_ms))
        assert r.p10_ms <= r.median_ms <= r.p90_ms

    csv_path = write_csv(results, tmp_path / "out" / "profile.csv")
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == CSV_COLUMNS
    assert [(int(r["prefill_tokens"]), int(r["decode_batch_size"]), int(r["context_len"])) for r in rows] == [
        (p.prefill_tokens, p.decode_batch_size, p.context_len) for p in points
    ]
    assert read_csv(csv_path) == results

    png = plot_profile(results, tmp_path / "out" / "profile.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_short_points_are_warmed_up_in_every_pass(engine, monkeypatch):
    """A short iteration right after a long one runs on the caches the long one left: points of at most
    ``rewarm_tokens`` tokens get an untimed run before each timed one, the others only in the first pass."""
    executor = engine.executor
    runs: list[int] = []
    real = executor.execute
    monkeypatch.setattr(executor, "execute", lambda step: runs.append(step.num_tokens) or real(step))
    short, long = GridPoint(0, 2, 8), GridPoint(8, 0, 8)
    results = profile_grid(engine, [short, long], repeats=3, warmup=1, rewarm_tokens=2)
    assert [r.repeats for r in results] == [3, 3]
    assert runs == [2, 2, 8, 8] + [2, 2, 8] * 2  # warm-up then timed run; in later passes only the short one
    assert engine.block_manager.num_used_blocks == 0


def test_points_that_do_not_fit_are_refused_by_name(engine):
    # 4 decodes over 2000 tokens need 4 * 126 blocks; the pool has 256.
    with pytest.raises(ValueError, match=r"decode_batch_size=4, context_len=2000\).*KV blocks"):
        time_point(engine, GridPoint(0, 4, 2000))
    too_long = engine.max_model_len
    with pytest.raises(ValueError, match=rf"prefill_tokens=8, .*context_len={too_long}\).*max_model_len"):
        profile_grid(engine, [GridPoint(8, 0, 8), GridPoint(8, 0, too_long)])
    with pytest.raises(ValueError, match="the batch is empty"):
        time_point(engine, GridPoint(0, 0, 8))
    assert engine.block_manager.num_used_blocks == 0


def test_decode_iteration_time_is_seconds(engine):
    t = measure_decode_iteration_time(engine, batch_size=2, context_len=32, repeats=2)
    assert isinstance(t, float)
    assert 0 < t < 60
    assert engine.block_manager.num_used_blocks == 0


def test_profile_command_end_to_end(tmp_path, capsys):
    out = tmp_path / "prof"
    argv = ["profile", "--prefill-tokens", "0,8", "--decode-batch-sizes", "0,1", "--context-lens", "16"]
    argv += ["--repeats", "1", "--warmup", "0", "--num-kv-blocks", "64", "--no-progress"]
    rc = main([*argv, "--output-dir", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "context 16" in printed and str(out / "profile.csv") in printed
    assert [(r.prefill_tokens, r.decode_batch_size) for r in read_csv(out / "profile.csv")] == [
        (0, 1),
        (8, 0),
        (8, 1),
    ]
    assert (out / "profile.png").stat().st_size > 0


def test_profile_command_rejects_bad_values(tmp_path, capsys):
    assert main(["profile", "--prefill-tokens", "8,x", "--output-dir", str(tmp_path)]) == 2
    assert "error: --prefill-tokens must be a comma list of integers" in capsys.readouterr().err
    # 64 blocks hold 1024 tokens: the context is capped there, so a 5000-token point cannot run.
    rc = main(["profile", "--context-lens", "5000", "--num-kv-blocks", "64", "--output-dir", str(tmp_path)])
    assert rc == 2
    assert "max_model_len is 1024" in capsys.readouterr().err
    assert not (tmp_path / "profile.csv").exists()
