"""Prometheus metrics of a running server (``GET /metrics``), fed by the engine core's outputs.

Two sets in one registry: the ``sarathi_*`` families (queues, KV blocks, iteration time and tokens, prefill
and decode tokens per iteration, token-budget use, latencies) and vLLM's ``vllm:*`` names
(``vllm_metrics.py``) for dashboards written for vLLM.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sarathi.engine.core_messages import CoreOutputs
from sarathi.entrypoints.openai.vllm_metrics import VllmMetrics
from sarathi.outputs import RequestMetrics
from sarathi.sampling_params import SamplingParams

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60, 120)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_FRACTION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class ServerMetrics:
    """Queue, cache, iteration and request-latency metrics in a registry of their own.

    ``token_budget``: the per-iteration token budget of a chunking scheduler (sarathi, simple_chunking),
    for ``sarathi_token_budget_utilization``; None for the other schedulers.
    """

    def __init__(self, model_name: str = "", token_budget: int | None = None) -> None:
        r = self.registry = CollectorRegistry()
        self.vllm = VllmMetrics(r, model_name)
        self.token_budget = token_budget
        self.waiting = Gauge("sarathi_num_requests_waiting", "Requests waiting to be scheduled", registry=r)
        self.running = Gauge("sarathi_num_requests_running", "Requests running", registry=r)
        self.preempted = Gauge(
            "sarathi_num_requests_preempted", "Waiting requests that were preempted", registry=r
        )
        self.kv_used = Gauge("sarathi_kv_cache_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_total = Gauge("sarathi_kv_cache_blocks_total", "KV cache blocks in the pool", registry=r)
        self.in_flight = Gauge(
            "sarathi_num_requests_in_flight", "Requests the API server is serving", registry=r
        )
        self.preemptions = Counter("sarathi_preemptions", "Preemptions (recompute)", registry=r)
        self.prefix_cache_queries = Counter(
            "sarathi_prefix_cache_queries",
            "Tokens of admitted requests looked up in the prefix cache",
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "sarathi_prefix_cache_hits", "Tokens of admitted requests found in the prefix cache", registry=r
        )
        self.iteration_time = Histogram(
            "sarathi_iteration_time_seconds",
            "Wall time of one engine iteration",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.iteration_tokens = Histogram(
            "sarathi_iteration_tokens",
            "Tokens processed in one iteration",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.iteration_prefill_tokens = Histogram(
            "sarathi_iteration_prefill_tokens",
            "Prompt (prefill chunk) tokens in one iteration",
            buckets=(0, *_TOKEN_BUCKETS),
            registry=r,
        )
        self.iteration_decode_tokens = Histogram(
            "sarathi_iteration_decode_tokens",
            "Decode tokens (one per decoding request) in one iteration",
            buckets=(0, *_TOKEN_BUCKETS),
            registry=r,
        )
        self.budget = Gauge(
            "sarathi_token_budget", "Per-iteration token budget (0: not a chunking scheduler)", registry=r
        )
        self.budget.set(token_budget or 0)
        self.budget_use = Histogram(
            "sarathi_token_budget_utilization",
            "Fraction of the token budget one iteration used (chunking schedulers)",
            buckets=_FRACTION_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "sarathi_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter("sarathi_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "sarathi_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tbt = Histogram(
            "sarathi_time_between_tokens_seconds", "Time between tokens", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "sarathi_e2e_request_latency_seconds",
            "Arrival to last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter("sarathi_requests", "Requests by outcome", ["finish_reason"], registry=r)

    def observe_core_outputs(self, out: CoreOutputs) -> None:
        if out.snapshot is not None:
            s = out.snapshot
            self.waiting.set(s.num_waiting)
            self.running.set(s.num_running)
            self.preempted.set(s.num_preempted)
            self.kv_used.set(s.num_kv_blocks_used)
            self.kv_total.set(s.num_kv_blocks_total)
            self.vllm.observe_snapshot(s)
        for it in out.iterations:
            self.iteration_time.observe(it.wall_time)
            self.iteration_tokens.observe(it.num_tokens)
            self.iteration_prefill_tokens.observe(it.num_prefill_tokens)
            self.iteration_decode_tokens.observe(it.num_decode_tokens)
            if self.token_budget:
                self.budget_use.observe(it.num_tokens / self.token_budget)
            if it.num_preempted:
                self.preemptions.inc(it.num_preempted)
            self.vllm.observe_iteration(it)
            self.prefix_cache_queries.inc(it.prefix_cache_queries)
            self.prefix_cache_hits.inc(it.prefix_cache_hits)
        for delta in out.outputs:
            self.generation_tokens.inc(len(delta.new_token_ids))
            self.vllm.observe_delta(delta)

    def observe_request_params(self, params: SamplingParams) -> None:
        """An accepted API request's sampling parameters (its ``n`` and ``max_tokens``)."""
        self.vllm.observe_request_params(params)

    def observe_request_end(
        self,
        outcome: str,
        num_prompt_tokens: int,
        metrics: RequestMetrics | None = None,
        num_output_tokens: int = 0,
    ) -> None:
        """``outcome``: a finish reason (stop, length), or abort / error / rejected."""
        self.requests.labels(outcome).inc()
        self.prompt_tokens.inc(num_prompt_tokens)
        self.vllm.observe_request_end(outcome, num_prompt_tokens, num_output_tokens, metrics)
        if metrics is None:
            return
        if metrics.ttft is not None:
            self.ttft.observe(metrics.ttft)
        for gap in metrics.tbts:
            self.tbt.observe(gap)
        if metrics.e2e_latency is not None:
            self.e2e.observe(metrics.e2e_latency)

    def render(self) -> bytes:
        return generate_latest(self.registry)
