"""``sarathi bench --url`` against a live server gives the same summary keys as the in-process bench."""

from __future__ import annotations

import json
import math

from sarathi.benchmark.bench import SUMMARY_KEYS
from sarathi.entrypoints.cli import main

WORKLOAD = [
    "--trace",
    "synthetic",
    "--prompt-len",
    "30",
    "--output-len",
    "6",
    "--num-requests",
    "4",
    "--qps",
    "8",
    "--token-budget",
    "64",
]


def _summary(out) -> dict:
    (entry,) = json.loads((out / "summary.json").read_text())
    return entry


def test_bench_over_http_matches_in_process_keys(server, tmp_path):
    http_dir, local_dir = tmp_path / "http", tmp_path / "local"
    assert (
        main(["bench", "--url", server.url, *WORKLOAD, "--output-dir", str(http_dir), "--no-progress"]) == 0
    )
    assert (
        main(["bench", *WORKLOAD, "--num-kv-blocks", "64", "--output-dir", str(local_dir), "--no-progress"])
        == 0
    )
    over_http, local = _summary(http_dir), _summary(local_dir)
    assert set(over_http) == set(local) and set(SUMMARY_KEYS) <= set(over_http)
    assert over_http["num_requests"] == local["num_requests"] == 4
    assert over_http["num_output_tokens"] == local["num_output_tokens"] == 24
    for key in (
        "ttft_p50",
        "ttft_p99",
        "tbt_p50",
        "tbt_p99",
        "tbt_max",
        "e2e_p50",
        "throughput_tokens_per_s",
    ):
        assert math.isfinite(over_http[key]) and over_http[key] > 0, key
    assert (http_dir / "tbt_cdf.png").exists() and (http_dir / "ttft_cdf.png").exists()
