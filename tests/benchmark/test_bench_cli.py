"""``sarathi bench`` in-process on the embedded model: a tiny workload under two schedulers."""

from __future__ import annotations

import json
import math

import pytest

from sarathi.benchmark.bench import SUMMARY_KEYS, bench_configs
from sarathi.entrypoints.cli import main


def test_short_bench_of_two_schedulers_writes_summary_csvs_and_plots(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(
        [
            "bench",
            "--schedulers",
            "sarathi,vllm",
            "--token-budget",
            "32",
            "--trace",
            "synthetic",
            "--prompt-len",
            "40",
            "--output-len",
            "5",
            "--num-requests",
            "3",
            "--qps",
            "20",
            "--num-kv-blocks",
            "32",
            "--output-dir",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    entries = json.loads((out / "summary.json").read_text())
    assert [e["scheduler"] for e in entries] == ["sarathi", "vllm"]
    for e in entries:
        assert set(SUMMARY_KEYS) <= set(e)
        assert e["num_requests"] == 3 and e["num_output_tokens"] == 15 and e["token_budget"] == 32
        for k in SUMMARY_KEYS[1:]:
            assert isinstance(e[k], int | float) and math.isfinite(e[k]), (k, e[k])
        assert 0 < e["tbt_p50"] <= e["tbt_p99"] <= e["tbt_max"] and e["ttft_p50"] > 0
        assert 0 <= e["scheduling_delay_p50"] <= e["ttft_p50"]
        for name in ("requests.csv", "iterations.csv", "cdf.csv", "summary.json"):
            assert (out / e["label"] / name).stat().st_size > 0
    # 3 prompts of 40 tokens under a budget of 32: sarathi chunks them, so no iteration exceeds the budget.
    iters = (out / "sarathi" / "iterations.csv").read_text().splitlines()[1:]
    assert max(int(r.split(",")[3]) + int(r.split(",")[4]) for r in iters) <= 32
    for png in ("tbt_cdf.png", "ttft_cdf.png", "tokens_over_time.png", "iteration_time_vs_tokens.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sarathi" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--schedulers", "fifo"], "unknown scheduler 'fifo'"),
        (["--arrival", "trace", "--trace", "synthetic"], "needs a trace with an arrived_at column"),
        (["--qps", "-1"], "qps must be a positive number"),
        (["--trace", "missing.csv"], "neither a file nor a built-in trace"),
        (
            ["--url", "http://127.0.0.1:9", "--num-requests", "1"],
            "cannot use the server at http://127.0.0.1:9",
        ),
    ],
)
def test_bad_values_exit_2_with_a_message(flags, message, capsys, tmp_path):
    assert main(["bench", *flags, "--output-dir", str(tmp_path), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_configs_expand_budgets_only_for_chunking_schedulers():
    labels = [c.label for c in bench_configs(["sarathi", "vllm", "sarathi"], [32, 64])]
    assert labels == ["sarathi@32", "sarathi@64", "vllm"]
