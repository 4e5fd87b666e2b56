"""Prometheus metrics of a running server (``GET /metrics``), fed by the engine core's outputs."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sarathi.engine.core_messages import CoreOutputs
from sarathi.outputs import RequestMetrics

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60, 120)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class ServerMetrics:
    """Queue, cache, iteration and request-latency metrics in a registry of their own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
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
        for it in out.iterations:
            self.iteration_time.observe(it.wall_time)
            self.iteration_tokens.observe(it.num_tokens)
            if it.num_preempted:
                self.preemptions.inc(it.num_preempted)
            self.prefix_cache_queries.inc(it.prefix_cache_queries)
            self.prefix_cache_hits.inc(it.prefix_cache_hits)
        for delta in out.outputs:
            self.generation_tokens.inc(len(delta.new_token_ids))

    def observe_request_end(
        self, outcome: str, num_prompt_tokens: int, metrics: RequestMetrics | None = None
    ) -> None:
        """``outcome``: a finish reason (stop, length), or abort / error / rejected."""
        self.requests.labels(outcome).inc()
        self.prompt_tokens.inc(num_prompt_tokens)
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
