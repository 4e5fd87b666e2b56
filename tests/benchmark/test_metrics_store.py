"""Metrics store math on hand-made timelines."""

from __future__ import annotations

import csv
import json
import math

import pytest

from sarathi.benchmark.metrics_store import MetricsStore, json_safe
from sarathi.metrics import percentile
from sarathi.outputs import IterationStats


def _store() -> MetricsStore:
    s = MetricsStore()
    # a: arrives at 10, scheduled at 10.5, tokens at 11, 11.1, 11.3, 12.0; finished at 12.0.
    s.on_arrival("a", 10.0, num_prompt_tokens=100, num_output=4)
    s.on_scheduled("a", 10.5)
    s.on_scheduled("a", 10.9)  # later schedulings (after a preemption) do not move the first one
    for t in (11.0, 11.1, 11.3, 12.0):
        s.on_token("a", t)
    s.on_finish("a", 12.0, num_preemptions=1)
    # b: arrives at 11, scheduled at 13, tokens at 14 and 14.5, finished at 14.5.
    s.on_arrival("b", 11.0, num_prompt_tokens=20, num_output=2)
    s.on_scheduled("b", 13.0)
    s.on_token("b", 14.0)
    s.on_token("b", 14.5)
    s.on_finish("b", 14.5, num_preemptions=0)
    s.on_iteration(IterationStats(0, 10.5, 0.5, 64, 0, 1))
    s.on_iteration(IterationStats(1, 11.0, 0.1, 0, 1, 1))
    return s


def test_request_metrics_from_timestamps():
    a, b = _store().requests["a"], _store().requests["b"]
    assert a.scheduling_delay == pytest.approx(0.5)
    assert a.ttft == pytest.approx(1.0)
    assert a.tbts == pytest.approx([0.1, 0.2, 0.7])
    assert a.e2e_latency == pytest.approx(2.0)
    assert a.normalized_e2e_latency == pytest.approx(0.5)
    assert (b.scheduling_delay, b.ttft, *b.tbts, b.e2e_latency) == pytest.approx((2.0, 3.0, 0.5, 3.5))


def test_summary_percentiles_throughput_and_counts():
    s = _store().summary()
    tbts = [0.1, 0.2, 0.7, 0.5]
    assert s["tbt_p50"] == pytest.approx(0.35)  # linear interpolation between 0.2 and 0.5
    assert s["tbt_p99"] == pytest.approx(percentile(tbts, 99))
    assert s["tbt_max"] == pytest.approx(0.7)
    assert s["ttft_p50"] == pytest.approx(2.0)
    assert s["scheduling_delay_p50"] == pytest.approx(1.25)
    assert s["e2e_p50"] == pytest.approx(2.75)
    assert s["num_output_tokens"] == 6 and s["num_prompt_tokens"] == 120
    assert s["duration_s"] == pytest.approx(4.5)  # first arrival 10 -> last token 14.5
    assert s["throughput_tokens_per_s"] == pytest.approx(6 / 4.5)
    assert s["num_preemptions"] == 1 and s["num_finished"] == 2 and s["num_iterations"] == 2


def test_percentile_interpolates_and_is_nan_on_empty():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0, 1.0, 3.0], 0) == 1.0 and percentile([5.0, 1.0, 3.0], 100) == 5.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert math.isnan(percentile([], 50))


def test_cdf_is_sorted_and_ends_at_one():
    cdf = _store().cdf("tbt")
    assert [v for v, _ in cdf] == pytest.approx([0.1, 0.2, 0.5, 0.7])
    assert [p for _, p in cdf] == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_unfinished_and_unknown_values():
    s = MetricsStore()
    s.on_arrival("x", 0.0, 10, 5)
    s.on_token("x", 1.0)
    summary = s.summary()
    assert summary["num_finished"] == 0 and math.isnan(summary["e2e_p50"]) and math.isnan(summary["tbt_max"])
    s.on_finish("x", 1.0, num_preemptions=None)  # unknown (HTTP mode)
    assert s.summary()["num_preemptions"] is None
    with pytest.raises(ValueError, match="already arrived"):
        s.on_arrival("x", 0.0, 1, 1)


def test_write_exports_csvs_and_strict_json(tmp_path):
    summary = _store().write(tmp_path, extra_summary={"scheduler": "sarathi", "qps": math.inf})
    assert summary["scheduler"] == "sarathi"
    loaded = json.loads((tmp_path / "summary.json").read_text())
    assert loaded["qps"] is None and loaded["tbt_max"] == pytest.approx(0.7)
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["request_id"] for r in rows] == ["a", "b"] and float(rows[0]["ttft"]) == pytest.approx(1.0)
    with (tmp_path / "iterations.csv").open() as f:
        assert [int(r["num_prefill_tokens"]) for r in csv.DictReader(f)] == [64, 0]
    with (tmp_path / "cdf.csv").open() as f:
        metrics = {r["metric"] for r in csv.DictReader(f)}
    assert {"ttft", "tbt", "scheduling_delay"} <= metrics
    assert json_safe([math.nan, 1.0, {"k": -math.inf}]) == [None, 1.0, {"k": None}]
