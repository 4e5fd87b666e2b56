"""quant_gemm's int8-path and dequantized-tile thresholds timed on this machine: the choice rules, the
kernel's settings, the cache (keyed by CPU, kernel build and level), `SARATHI_INT8_ROWS`, and a loaded
quantized model running with them."""

from __future__ import annotations

import json

import pytest
import torch

from sarathi.model import kernels, quant_path_tuning
from sarathi.model.loader import load_model
from sarathi.model.quant_path_tuning import (
    DEQUANT_STEPS,
    MIN_ROWS,
    ROW_STEPS,
    SHAPES,
    DequantTiming,
    Int8Rows,
    PathTiming,
    dequant_threshold,
    threshold,
)

pytestmark = pytest.mark.skipif(
    not kernels.portable_available(), reason="sarathi's CPU kernels do not run here"
)
WIDTHS = (4, 5, 6, 8)


@pytest.fixture
def restores_thresholds():
    """Puts back the process's thresholds and apply()'s memo after a test that changes them."""
    before = {b: kernels.quant_int8_rows(b) for b in WIDTHS}
    dequant_before = {o: kernels.quant_dequant_rows(o) for o in (False, True)}
    applied = dict(quant_path_tuning._applied)
    yield
    for b in WIDTHS:
        kernels.set_quant_int8_rows(b, -1 if before[b] == kernels.quant_int8_rows_builtin(b) else before[b])
    for o, r in dequant_before.items():
        kernels.set_quant_dequant_rows(o, -1 if r == kernels.quant_dequant_rows_builtin(o) else r)
    quant_path_tuning._applied.clear()
    quant_path_tuning._applied.update(applied)


def timings(ratios: dict[str, list[float]]) -> list[PathTiming]:
    """Both shapes of each format at ROW_STEPS, the tile path 1 ms, the int8 path the given ratio."""
    return [
        PathTiming(fmt, shape, rows, ratio, 1.0)
        for fmt, per_step in ratios.items()
        for shape in SHAPES
        for rows, ratio in zip(ROW_STEPS, per_step, strict=False)
    ]


def test_threshold_is_the_last_step_the_int8_path_wins_summed_over_formats() -> None:
    # Q4_0 behind at 64 rows, but the three formats summed still ahead there; behind at 128
    four = {
        "Q4_0": [0.8, 0.9, 1.0, 1.1, 1.2, 1.3],
        "Q4_1": [0.8, 0.8, 0.8, 0.8, 1.0, 1.0],
        "Q4_K": [0.8, 0.8, 0.8, 0.9, 0.95, 1.0],
    }
    assert threshold(timings(four), ("Q4_0", "Q4_1", "Q4_K")) == 64
    # behind already at 8 rows: the floor
    assert threshold(timings({"Q6_K": [1.1, 1.3]}), ("Q6_K",)) == MIN_ROWS
    # ahead at every step: the last one
    assert threshold(timings({"Q8_0": [0.5] * 6}), ("Q8_0",)) == ROW_STEPS[-1]
    # a format timed no further (clearly behind at 16 rows) ends the width at the first step it missed
    five = {"Q5_0": [0.9, 1.3], "Q5_K": [0.5] * 6}
    assert threshold(timings(five), ("Q5_0", "Q5_K")) == 16
    # ahead again after falling behind does not count
    assert threshold(timings({"Q8_0": [0.9, 1.1, 0.9, 0.9, 0.9, 0.9]}), ("Q8_0",)) == 8


def test_a_step_the_int8_path_loses_is_timed_again_and_each_paths_faster_median_kept(monkeypatch) -> None:
    # one burst from another process during the 64-row step: 1.6x, where its neighbours are 0.8x
    monkeypatch.setattr(quant_path_tuning, "WIDTH_FORMATS", {4: ("Q4_K",)})
    monkeypatch.setattr(quant_path_tuning, "SHAPES", {"up": (16, 256)})
    monkeypatch.setattr(quant_path_tuning, "STREAM_BYTES", 1)
    monkeypatch.setattr(quant_path_tuning, "measure_dequant_rows", lambda progress=None: ({}, []))
    calls = []

    def fake_medians(int8_path, tile_path, pairs):
        calls.append(len(calls))
        if len(calls) == 4:  # the 64-row step, first timing
            return 0.0024, 0.0015, 1.6
        if len(calls) == 5:  # timed again: each path's faster median is kept
            return 0.0012, 0.0016, 0.75
        return 0.0008, 0.001, 0.8

    monkeypatch.setattr(quant_path_tuning, "alternating_medians", fake_medians)
    tuned = quant_path_tuning.measure()
    assert len(calls) == len(ROW_STEPS) + 1  # only the step it lost was timed twice
    assert [t.rows for t in tuned.timings] == list(ROW_STEPS)
    at_64 = next(t for t in tuned.timings if t.rows == 64)
    assert (at_64.int8_ms, at_64.tile_ms) == (1.2, 1.5)
    assert tuned.rows[4] == ROW_STEPS[-1]  # not stopped at 64 by the burst


def test_a_set_threshold_routes_quant_gemm_and_minus_one_restores_the_table(restores_thresholds) -> None:
    w = quant_path_tuning.random_weight("Q4_K", 48, 512)
    x = torch.randn(12, 512)
    outs = {}
    for int8_rows in (12, 0):
        outs[int8_rows] = torch.empty(12, 48)
        kernels.quant_gemm(x, w, outs[int8_rows], int8_rows=int8_rows)
    assert not torch.equal(outs[12], outs[0])  # the two paths round x differently
    for rows, path in ((12, 12), (11, 0)):
        kernels.set_quant_int8_rows(4, rows)
        assert kernels.quant_int8_rows(4) == rows
        out = torch.empty(12, 48)
        kernels.quant_gemm(x, w, out)
        assert torch.equal(out, outs[path])
    kernels.set_quant_int8_rows(4, -1)
    assert kernels.quant_int8_rows(4) == kernels.quant_int8_rows_builtin(4)
    with pytest.raises(RuntimeError, match="rows must be -1"):
        kernels.set_quant_int8_rows(4, -2)
    with pytest.raises(RuntimeError, match="unsupported code width"):
        kernels.set_quant_int8_rows(7, 8)


def dequant_timings(ratios: dict[str, list[float]]) -> list[DequantTiming]:
    """Timings at DEQUANT_STEPS (from the most rows down), one per format and shape, the dequantized path at
    `ratio` times the tile path's 1 ms."""
    return [
        DequantTiming(f, shape, rows, r, 1.0)
        for f, rs in ratios.items()
        for rows, r in zip(DEQUANT_STEPS, rs, strict=False)
        for shape in SHAPES
    ]


def test_dequant_threshold_is_the_fewest_rows_from_which_the_dequantized_path_wins_summed() -> None:
    assert tuple(sorted(DEQUANT_STEPS, reverse=True)) == DEQUANT_STEPS
    # Q5_0 behind at 48 rows, but the two summed ahead there; behind at 32
    plain = {"Q5_0": [0.95, 0.97, 1.0, 1.05, 1.1, 1.2], "Q8_0": [0.9, 0.9, 0.9, 0.9, 1.05, 0.95]}
    assert dequant_threshold(dequant_timings(plain), ("Q5_0", "Q8_0")) == 48
    # behind already at the most rows: the kernel's own stands
    assert dequant_threshold(dequant_timings({"Q6_K": [1.1]}), ("Q6_K",)) == -1
    # ahead at every step: the fewest rows
    assert dequant_threshold(dequant_timings({"Q4_K": [0.8] * 6}), ("Q4_K",)) == DEQUANT_STEPS[-1]
    # a format timed no further (clearly behind at 64 rows, the two summed still ahead there) ends the kind
    # at the step it missed
    offsets = {"Q4_1": [0.9, 0.9, 1.3], "Q4_K": [0.5] * 6}
    assert dequant_threshold(dequant_timings(offsets), ("Q4_1", "Q4_K")) == 64


def test_a_set_dequant_threshold_routes_quant_gemm_and_minus_one_restores_the_kernels(restores_thresholds):
    if kernels.quant_dequant_rows_builtin(True) >= 2**62:
        pytest.skip("this build has no dequantized-tile path (the AVX2 one)")
    w = quant_path_tuning.random_weight("Q4_K", 48, 512)
    x = torch.randn(40, 512)
    outs = {}
    for from_rows in (40, 41):
        kernels.set_quant_dequant_rows(True, from_rows)
        assert kernels.quant_dequant_rows(True) == from_rows
        outs[from_rows] = torch.empty(40, 48)
        kernels.quant_gemm(x, w, outs[from_rows], int8_rows=0)
    # bf16-rounded weights against the file's exact values: the paths differ, each within bf16's rounding
    assert not torch.equal(outs[40], outs[41])
    torch.testing.assert_close(outs[40], outs[41], rtol=2e-2, atol=2e-2 * outs[41].abs().max().item())
    kernels.set_quant_dequant_rows(True, -1)
    assert kernels.quant_dequant_rows(True) == kernels.quant_dequant_rows_builtin(True)
    for bad in (0, -2):
        with pytest.raises(RuntimeError, match="rows must be -1"):
            kernels.set_quant_dequant_rows(True, bad)


@pytest.mark.skipif(kernels.level() in ("vnni", "avx512bw"), reason="the AVX-512 int8 levels time nothing")
def test_apply_sets_the_kept_choice_once_per_process(tmp_path, monkeypatch, restores_thresholds) -> None:
    monkeypatch.setenv("SARATHI_CACHE_DIR", str(tmp_path))
    key = quant_path_tuning.tuning_key()
    kept = Int8Rows({4: 16, 5: 8, 6: 4, 8: 64}, [], 1.0, key, {False: 64, True: -1})
    path = quant_path_tuning.cached_path()
    assert path.is_relative_to(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(kept.to_json()))
    assert Int8Rows.from_json(json.loads(path.read_text())) == kept
    kernels.set_quant_dequant_rows(True, 20)  # -1 kept: the kernel's own
    quant_path_tuning._applied.clear()
    assert quant_path_tuning.apply() == kept.rows
    assert {b: kernels.quant_int8_rows(b) for b in WIDTHS} == kept.rows
    # An AVX2 build has no dequantized-tile path: it reports none whatever is set.
    no_tile_path = kernels.quant_dequant_rows_builtin(False) >= 2**62
    expected = kernels.quant_dequant_rows_builtin(False) if no_tile_path else 64
    assert kernels.quant_dequant_rows(False) == expected
    assert kernels.quant_dequant_rows(True) == kernels.quant_dequant_rows_builtin(True)
    path.unlink()  # the process's choice is made: nothing is read or timed again
    assert quant_path_tuning.apply() == kept.rows
    assert not path.exists()


@pytest.mark.skipif(kernels.level() in ("vnni", "avx512bw"), reason="the AVX-512 int8 levels time nothing")
def test_a_dequant_rows_setting_stands_over_the_timed_choice(tmp_path, monkeypatch, restores_thresholds):
    """SARATHI_DEQUANT_ROWS (read by the kernel once, for measurements) keeps apply() from setting the timed
    dequantized-tile thresholds over it; the int8 ones are set as always."""
    monkeypatch.setenv("SARATHI_CACHE_DIR", str(tmp_path))
    for o in (False, True):
        kernels.set_quant_dequant_rows(o, -1)
    own = {o: kernels.quant_dequant_rows(o) for o in (False, True)}  # the kernel reads no setting after
    monkeypatch.setenv("SARATHI_DEQUANT_ROWS", "1")
    key = quant_path_tuning.tuning_key()
    kept = Int8Rows({4: 16, 5: 8, 6: 4, 8: 64}, [], 1.0, key, {False: 64, True: 32})
    path = quant_path_tuning.cached_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(kept.to_json()))
    quant_path_tuning._applied.clear()
    assert quant_path_tuning.apply() == kept.rows  # the int8 thresholds are set, the dequantized ones left
    assert {o: kernels.quant_dequant_rows(o) for o in (False, True)} == own
    assert {b: kernels.quant_int8_rows(b) for b in WIDTHS} == kept.rows


def test_builtin_keeps_the_kernels_table_and_other_values_are_refused(monkeypatch, restores_thresholds):
    for b in WIDTHS:
        kernels.set_quant_int8_rows(b, -1)
    for o in (False, True):
        kernels.set_quant_dequant_rows(o, -1)
    quant_path_tuning._applied.clear()
    monkeypatch.setenv("SARATHI_INT8_ROWS", "builtin")
    assert quant_path_tuning.apply() is None
    assert all(kernels.quant_int8_rows(b) == kernels.quant_int8_rows_builtin(b) for b in WIDTHS)
    assert all(kernels.quant_dequant_rows(o) == kernels.quant_dequant_rows_builtin(o) for o in (False, True))
    quant_path_tuning._applied.clear()
    monkeypatch.setenv("SARATHI_INT8_ROWS", "fast")
    with pytest.raises(ValueError, match=r"SARATHI_INT8_ROWS must be 'measured'.*'fast'"):
        quant_path_tuning.apply()


@pytest.mark.skipif(kernels.level() in ("vnni", "avx512bw"), reason="the AVX-512 int8 levels time nothing")
def test_a_cache_folder_it_cannot_write_still_gets_this_processs_timing(
    tmp_path, monkeypatch, restores_thresholds
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SARATHI_CACHE_DIR", str(tmp_path / "a-file" / "cache"))  # mkdir fails under a file
    timed = Int8Rows({4: 32, 5: 16, 6: 8, 8: 128}, [], 1.0, quant_path_tuning.tuning_key())
    monkeypatch.setattr(quant_path_tuning, "measure", lambda progress=None: timed)
    quant_path_tuning._applied.clear()
    assert quant_path_tuning.apply() == timed.rows
    assert {b: kernels.quant_int8_rows(b) for b in WIDTHS} == timed.rows


@pytest.mark.skipif(kernels.level() in ("vnni", "avx512bw"), reason="the AVX-512 int8 levels time nothing")
def test_a_failed_timing_leaves_the_kernels_table(tmp_path, monkeypatch, restores_thresholds, caplog) -> None:
    monkeypatch.setenv("SARATHI_CACHE_DIR", str(tmp_path))

    def fails(progress=None):
        raise MemoryError("no room for the weight copies")

    monkeypatch.setattr(quant_path_tuning, "measure", fails)
    for b in WIDTHS:
        kernels.set_quant_int8_rows(b, -1)
    quant_path_tuning._applied.clear()
    assert quant_path_tuning.apply() is None
    assert all(kernels.quant_int8_rows(b) == kernels.quant_int8_rows_builtin(b) for b in WIDTHS)
    assert "no room for the weight copies" in caplog.text


def test_a_key_names_the_cpu_the_kernel_build_and_the_level() -> None:
    key = quant_path_tuning.tuning_key()
    assert key["kernels"] == kernels.source_digest()
    assert key["kernel_level"] == kernels.level()
    assert {"vendor", "family", "model", "flags"} <= set(key["cpu"])


@pytest.mark.skipif(kernels.level() in ("vnni", "avx512bw"), reason="the AVX-512 int8 levels time nothing")
def test_a_loaded_quantized_model_runs_with_this_machines_measured_choice() -> None:
    """The embedded model, served in its own Q4_1 blocks, sets the thresholds this machine's timing chose
    (timed here if not yet kept: seconds); each is the rule's reading of the kept timings."""
    load_model(None, quantization="gguf")
    tuned = quant_path_tuning.load_or_measure()
    assert tuned.key == quant_path_tuning.tuning_key()
    for bits, formats in quant_path_tuning.WIDTH_FORMATS.items():
        assert tuned.rows[bits] in (MIN_ROWS, *ROW_STEPS)
        assert tuned.rows[bits] == threshold(tuned.timings, formats)
        assert kernels.quant_int8_rows(bits) == tuned.rows[bits]
    first = [t for t in tuned.timings if t.rows == ROW_STEPS[0]]
    assert {(t.format, t.shape) for t in first} == {
        (f, s) for fs in quant_path_tuning.WIDTH_FORMATS.values() for f in fs for s in SHAPES
    }
    assert all(t.int8_ms > 0 and t.tile_ms > 0 for t in tuned.timings)
    if kernels.quant_dequant_rows_builtin(True) >= 2**62:  # the AVX2 build: no dequantized-tile path to time
        assert tuned.dequant_rows == {} and tuned.dequant_timings == []
        return
    for offsets, formats in quant_path_tuning.dequant_kinds().items():
        chosen = tuned.dequant_rows[offsets]
        assert chosen in (-1, *DEQUANT_STEPS)
        assert chosen == dequant_threshold(tuned.dequant_timings, formats)
        expected = kernels.quant_dequant_rows_builtin(offsets) if chosen == -1 else chosen
        assert kernels.quant_dequant_rows(offsets) == expected
    most = [t for t in tuned.dequant_timings if t.rows == DEQUANT_STEPS[0]]
    assert {(t.format, t.shape) for t in most} == {
        (f, s) for fs in quant_path_tuning.dequant_kinds().values() for f in fs for s in SHAPES
    }
    assert all(t.dequant_ms > 0 and t.tile_ms > 0 for t in tuned.dequant_timings)
