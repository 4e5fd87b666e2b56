"""Prometheus families under vLLM's ``vllm:`` names, so dashboards and alerts written for vLLM work here.

Every family carries a ``model_name`` label. Gauges follow the engine core's snapshot after each
iteration; token counters follow the streamed deltas; request latencies (TTFT, inter-token, queue,
prefill, decode, end-to-end) are observed once per finished request from its ``RequestMetrics``; a
request's ``n`` and ``max_tokens`` once it is accepted.

vLLM's older names are served too, with the same values, for dashboards written before they were renamed:
``vllm:time_per_output_token_seconds`` (= the inter-token histogram), ``vllm:gpu_cache_usage_perc`` (= the
KV cache usage), and ``vllm:cpu_cache_usage_perc`` and ``vllm:num_requests_swapped`` (0: there is no swap
space; preemption recomputes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sarathi.engine.core_messages import EngineSnapshot
from sarathi.outputs import IterationStats, RequestMetrics, RequestOutput
from sarathi.sampling_params import SamplingParams

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60, 120, 300,
)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
N_BUCKETS = (1, 2, 5, 10, 20)
# vLLM's spellings of our finish reasons in ``vllm:request_success_total{finished_reason}``.
FINISHED_REASONS = ("stop", "length", "abort", "error")


class VllmMetrics:
    """The ``vllm:`` families vLLM users' dashboards query, in ``registry``, labelled with the model."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        r, m, label = registry, model_name, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"vllm:{name}", doc, label, registry=r).labels(m)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"vllm:{name}", doc, label, registry=r).labels(m)

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(f"vllm:{name}", doc, label, buckets=buckets, registry=r).labels(m)

        self.running = gauge("num_requests_running", "Requests in the running set")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full)")
        self.gpu_cache_usage = gauge("gpu_cache_usage_perc", "Older name of vllm:kv_cache_usage_perc")
        # No swap space here: these stay 0 (they exist for dashboards that query them).
        gauge("cpu_cache_usage_perc", "Fraction of CPU swap blocks in use (no swap space: 0)")
        gauge("num_requests_swapped", "Requests swapped out to CPU (no swap space: 0)")
        self.preemptions = counter("num_preemptions", "Preemptions (the request recomputes later)")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens prefilled")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.iteration_tokens = histogram(
            "iteration_tokens_total", "Tokens processed per engine iteration", TOKEN_BUCKETS
        )
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first token", LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between two output tokens", LATENCY_BUCKETS)
        self.tpot = histogram(
            "time_per_output_token_seconds", "Older name of vllm:inter_token_latency_seconds", LATENCY_BUCKETS
        )
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish", LATENCY_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Arrival to first scheduled", LATENCY_BUCKETS)
        self.prefill = histogram(
            "request_prefill_time_seconds", "First scheduled to first token", LATENCY_BUCKETS
        )
        self.decode = histogram("request_decode_time_seconds", "First token to finish", LATENCY_BUCKETS)
        self.inference = histogram(
            "request_inference_time_seconds", "First scheduled to finish", LATENCY_BUCKETS
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens of a finished request", TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens of a finished request", TOKEN_BUCKETS
        )
        self.max_tokens = histogram(
            "request_max_num_generation_tokens", "max_tokens of an accepted request", TOKEN_BUCKETS
        )
        self.params_max_tokens = histogram(
            "request_params_max_tokens", "max_tokens of an accepted request", TOKEN_BUCKETS
        )
        self.params_n = histogram("request_params_n", "n of an accepted request", N_BUCKETS)
        success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason",
            [*label, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(m, reason) for reason in FINISHED_REASONS}

    def observe_snapshot(self, s: EngineSnapshot) -> None:
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        usage = s.num_kv_blocks_used / s.num_kv_blocks_total if s.num_kv_blocks_total else 0.0
        self.kv_usage.set(usage)
        self.gpu_cache_usage.set(usage)

    def observe_iteration(self, it: IterationStats) -> None:
        self.iteration_tokens.observe(it.num_tokens)
        if it.num_preempted:
            self.preemptions.inc(it.num_preempted)

    def observe_delta(self, delta: RequestOutput) -> None:
        n = len(delta.new_token_ids)
        self.generation_tokens.inc(n)
        if n and delta.num_output_tokens == n:  # the request's first tokens: its prompt was just prefilled
            self.prompt_tokens.inc(delta.num_prompt_tokens)

    def observe_request_params(self, params: SamplingParams) -> None:
        """One accepted request's ``n`` and ``max_tokens``."""
        self.max_tokens.observe(params.max_tokens)
        self.params_max_tokens.observe(params.max_tokens)
        self.params_n.observe(params.n)

    def observe_request_end(
        self, reason: str, num_prompt_tokens: int, num_output_tokens: int, metrics: RequestMetrics | None
    ) -> None:
        """``reason``: a finish reason (stop, length), abort or error; rejected requests are not counted."""
        if reason not in self.success:
            return
        self.success[reason].inc()
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_output_tokens)
        if metrics is None:
            return
        first_token = metrics.token_times[0] if metrics.token_times else None
        scheduled, finished = metrics.first_scheduled_time, metrics.finished_time
        if metrics.ttft is not None:
            self.ttft.observe(metrics.ttft)
        for gap in metrics.tbts:
            self.itl.observe(gap)
            self.tpot.observe(gap)
        if metrics.e2e_latency is not None:
            self.e2e.observe(metrics.e2e_latency)
        if metrics.scheduling_delay is not None:
            self.queue.observe(metrics.scheduling_delay)
        if scheduled is not None and first_token is not None:
            self.prefill.observe(first_token - scheduled)
        if first_token is not None and finished is not None:
            self.decode.observe(finished - first_token)
        if scheduled is not None and finished is not None:
            self.inference.observe(finished - scheduled)
