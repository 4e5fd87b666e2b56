"""The measured latency model of this machine for an engine configuration: profiled once, then cached.

Profiling times the profiler's grid of batch shapes (``sarathi profile``), fits a ``MeasuredLatencyModel``
with its held-out error, and measures the engine's own per-iteration overhead on a short real run. The
result is cached under the cache folder, keyed by what changes iteration times: the CPU, core count,
torch version, model, dtypes, parallel layout and KV block size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

from sarathi.config import EngineConfig
from sarathi.simulator.batch_shape import BatchShape
from sarathi.simulator.measured import MeasuredLatencyModel, Sample, cross_validate, fit

PREFILL_TOKENS = (0, 16, 64, 256, 512)
DECODE_BATCH_SIZES = (0, 1, 4, 16, 32, 64)
CONTEXT_LENS = (128, 512, 1024)
OVERHEAD_REQUESTS = 24


def cpu_name() -> str:
    """The CPU model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_key(config: EngineConfig) -> dict:
    """What a latency profile depends on."""
    import torch

    m, p = config.model, config.parallel
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "model": m.model or "embedded",
        "load_format": m.load_format,
        "dtype": m.dtype,
        "compute_dtype": m.compute_dtype,
        "tensor_parallel_size": p.tensor_parallel_size,
        "pipeline_parallel_size": p.pipeline_parallel_size,
        "backend": p.backend,
        "block_size": config.cache.block_size,
    }


def cached_profile_path(config: EngineConfig) -> Path:
    from sarathi.model.embedded import cache_root

    digest = hashlib.sha256(json.dumps(profile_key(config), sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "latency-profiles" / f"{digest}.json"


def samples_from_results(results) -> list[Sample]:
    """Fitting samples from profiler results (median times)."""
    return [
        Sample(BatchShape.from_grid(r.prefill_tokens, r.decode_batch_size, r.context_len), r.median_ms / 1e3)
        for r in results
    ]


def measure_engine_overhead(engine, num_requests: int = OVERHEAD_REQUESTS) -> float:
    """Median seconds per iteration the engine spends outside its executor (scheduling, step building,
    output processing), over a short burst of real requests."""
    from sarathi.benchmark.runner import bench_params

    executor = engine.executor
    spent: list[float] = []
    real_submit, real_collect = executor.submit, executor.collect

    def timed(fn):
        def wrapper(*args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent.append(time.perf_counter() - start)

        return wrapper

    vocab = engine.arch.vocab_size
    for i in range(num_requests):
        prompt = [(7 + 131 * i + 17 * j) % vocab for j in range(48 + 8 * i)]
        engine.add_request(f"__overhead-{i}", prompt, bench_params(16))
    executor.submit, executor.collect = timed(real_submit), timed(real_collect)
    periods: list[float] = []
    try:
        while engine.has_unfinished_requests():
            spent.clear()
            start = time.perf_counter()
            engine.step()
            periods.append(time.perf_counter() - start - sum(spent))
    finally:
        executor.submit, executor.collect = real_submit, real_collect
    return max(0.0, statistics.median(periods))


def profile_machine(config: EngineConfig, repeats: int = 2, progress: bool = True) -> MeasuredLatencyModel:
    """Profile ``config``'s engine on this machine and return its fitted latency model."""
    from sarathi.benchmark.profiler import check_point, grid_points, profile_grid
    from sarathi.engine.llm_engine import LLMEngine

    started = time.monotonic()
    # The profiling engine must not itself want an adaptive budget (which would need this profile).
    sched = dataclasses.replace(config.scheduler, adaptive_tbt_slo=None)
    engine = LLMEngine(dataclasses.replace(config, scheduler=sched))
    try:
        fits = [p for p in CONTEXT_LENS if p + max(PREFILL_TOKENS) <= engine.max_model_len] or [128]
        points = [
            p for p in grid_points(PREFILL_TOKENS, DECODE_BATCH_SIZES, fits) if _fits(check_point, engine, p)
        ]
        results = profile_grid(engine, points, repeats=repeats, progress=progress)
        model = fit_profile(engine, results)
    finally:
        engine.shutdown()
    model.metadata["profiled_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    model.metadata["profile_seconds"] = round(time.monotonic() - started, 1)
    return model


def fit_profile(engine, results) -> MeasuredLatencyModel:
    """The latency model of ``engine`` fitted to profiler ``results``, with the engine's measured
    per-iteration overhead and, in its metadata, the profile key and the 5-fold held-out error."""
    samples = samples_from_results(results)
    model = fit(samples, num_stages=engine.config.parallel.pipeline_parallel_size)
    model.engine_overhead_s = measure_engine_overhead(engine)
    held_out = cross_validate(samples)
    model.metadata = {
        **profile_key(engine.config),
        "num_points": len(samples),
        "held_out_error": {"median": held_out.median, "p90": held_out.p90, "max": held_out.max},
    }
    return model


def _fits(check_point, engine, point) -> bool:
    """Whether the engine's KV pool and context hold ``point`` (shapes it cannot hold never occur)."""
    try:
        check_point(engine, point)
    except ValueError:
        return False
    return True


def machine_latency_model(config: EngineConfig, progress: bool = True) -> MeasuredLatencyModel:
    """The cached latency model of ``config`` on this machine, profiling (once) when there is none."""
    path = cached_profile_path(config)
    if path.is_file():
        try:
            return MeasuredLatencyModel.load(path)
        except ValueError:
            pass  # an old or damaged profile: measure again
    if progress:
        print(f"no latency profile of this machine for this configuration yet: profiling once ({path})")
    model = profile_machine(config, progress=progress)
    model.save(path)
    return model
