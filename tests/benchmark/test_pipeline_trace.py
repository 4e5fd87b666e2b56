"""Pipeline observability: stage timelines as a Chrome / Perfetto trace and the bubble fraction."""

from __future__ import annotations

import json

import pytest

from sarathi.benchmark.pipeline_trace import bubble_fractions, chrome_trace
from sarathi.engine.step_messages import StageTiming
from sarathi.entrypoints.cli import main
from sarathi.outputs import IterationStats


def test_bubble_fraction_is_idle_over_the_whole_span():
    # Stage 0 works [0,1) and [1,2); stage 1 works [1,2) and [2,3): span 3 s, each stage busy 2 s.
    timings = [
        StageTiming(0, 0, 0.0, 1.0),
        StageTiming(1, 0, 1.0, 2.0),
        StageTiming(0, 1, 1.0, 2.0),
        StageTiming(1, 1, 2.0, 3.0),
    ]
    assert bubble_fractions(timings) == pytest.approx([1 / 3, 1 / 3])
    assert bubble_fractions([]) == []


def test_chrome_trace_has_a_row_per_stage_and_one_for_the_engine():
    timings = [StageTiming(7, 0, 10.0, 10.5), StageTiming(7, 1, 10.5, 11.0)]
    it = IterationStats(0, 10.0, 1.1, 30, 2, 3, step_id=7)
    trace = chrome_trace(timings, [it])
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    got = sorted((e["tid"], round(e["ts"]), round(e["dur"])) for e in slices)
    assert got == [(0, 0, 1_100_000), (1, 0, 500_000), (2, 500_000, 500_000)]
    assert all(e["args"]["prefill_tokens"] == 30 for e in slices)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and "tid" in e}
    assert names == {"engine: micro-batches", "stage 0", "stage 1"}


def test_bench_with_two_pipeline_stages_writes_trace_and_bubble_fraction(tmp_path):
    out = tmp_path / "bench"
    flags = ["--trace", "synthetic", "--prompt-len", "40", "--output-len", "6", "--num-requests", "4"]
    flags += ["--qps", "50", "--num-kv-blocks", "64", "--output-dir", str(out), "--no-progress"]
    assert main(["bench", "--schedulers", "sarathi", "--token-budget", "32", "-pp", "2", *flags]) == 0
    (entry,) = json.loads((out / "summary.json").read_text())
    assert entry["pipeline_parallel_size"] == 2 and entry["pipeline_stages"] == 2
    assert 0 < entry["pipeline_bubble_fraction"] < 1 and len(entry["pipeline_bubble_fraction_per_stage"]) == 2
    assert entry["num_output_tokens"] == 24
    trace = json.loads((out / entry["label"] / "trace.json").read_text())
    tids = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert tids == {0, 1, 2}
    assert (out / "pipeline_stages.png").read_bytes()[:4] == b"\x89PNG"
