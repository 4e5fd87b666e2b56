"""/metrics under vLLM's names: every metric our example Grafana dashboard and vLLM's own example dashboard
query is served, with a ``model_name`` label, and the request counters move as requests finish."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana" / "sarathi-vllm-dashboard.json"
METRIC_NAME = re.compile(r"\b(vllm:[a-zA-Z0-9_:]+|sarathi_[a-zA-Z0-9_]+)")
# The series vLLM's example Grafana dashboard (examples/online_serving/prometheus_grafana) and its earlier
# versions query, written out by hand: older names (time_per_output_token, gpu_cache_usage_perc,
# cpu_cache_usage_perc, num_requests_swapped) are served beside the current ones.
VLLM_DASHBOARD_SERIES = (
    *(
        f"vllm:{h}_{suffix}"
        for h in (
            "e2e_request_latency_seconds",
            "time_per_output_token_seconds",
            "time_to_first_token_seconds",
            "inter_token_latency_seconds",
            "request_queue_time_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
            "request_inference_time_seconds",
            "request_prompt_tokens",
            "request_generation_tokens",
            "request_max_num_generation_tokens",
            "request_params_n",
            "request_params_max_tokens",
            "iteration_tokens_total",
        )
        for suffix in ("bucket", "sum", "count")
    ),
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_swapped",
    "vllm:gpu_cache_usage_perc",
    "vllm:cpu_cache_usage_perc",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
)


def _samples(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _dashboard_metric_names() -> set[str]:
    exprs = []

    def walk(node) -> None:
        if isinstance(node, dict):
            exprs.extend(v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text()))
    assert exprs
    return {m for e in exprs for m in METRIC_NAME.findall(e)}


def test_dashboard_metrics_exist_and_count_requests(server, openai_client, model_name):
    before = _samples(server)
    openai_client.completions.create(
        model=model_name, prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True}
    )
    chunks = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert len(list(chunks)) == 3
    after = _samples(server)

    served = {name for name, _ in after}
    wanted = _dashboard_metric_names()
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:request_success_total"} <= wanted
    assert not wanted - served, f"queried by the dashboard but not served: {sorted(wanted - served)}"
    missing = set(VLLM_DASHBOARD_SERIES) - served
    assert not missing, f"queried by vLLM's example dashboard but not served: {sorted(missing)}"
    for name, labels in after:
        if name.startswith("vllm:"):
            assert dict(labels)["model_name"] == model_name, name

    def delta(name: str, **labels: str) -> float:
        labels = {"model_name": model_name, **labels}
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:generation_tokens_total") == 7
    assert delta("vllm:request_generation_tokens_sum") == 7
    assert delta("vllm:prompt_tokens_total") == delta("vllm:request_prompt_tokens_sum") > 1
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:inter_token_latency_seconds_count") == 3 + 2
    assert delta("vllm:time_per_output_token_seconds_count") == 3 + 2
    assert delta("vllm:time_per_output_token_seconds_sum") == delta("vllm:inter_token_latency_seconds_sum")
    assert delta("vllm:request_max_num_generation_tokens_sum") == 4 + 3
    assert delta("vllm:request_max_num_generation_tokens_count") == delta("vllm:request_params_n_sum") == 2
    for phase in ("queue", "prefill", "decode"):
        assert delta(f"vllm:request_{phase}_time_seconds_count") == 2
    assert _value(after, "vllm:num_requests_running", model_name=model_name) == 0
    assert 0 <= _value(after, "vllm:kv_cache_usage_perc", model_name=model_name) < 1
    for old, new in [("gpu_cache_usage_perc", "kv_cache_usage_perc")]:
        assert _value(after, f"vllm:{old}", model_name=model_name) == _value(
            after, f"vllm:{new}", model_name=model_name
        )
    for zero in ("cpu_cache_usage_perc", "num_requests_swapped"):
        assert (f"vllm:{zero}", (("model_name", model_name),)) in after
        assert _value(after, f"vllm:{zero}", model_name=model_name) == 0
    assert _value(after, "sarathi_token_budget") == 64
    assert _value(after, "sarathi_iteration_decode_tokens_sum") >= 5
