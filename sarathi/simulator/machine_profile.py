"""The measured latency model of this machine for an engine configuration: profiled once, then cached.

Profiling times a grid of batch shapes (``sarathi profile``'s timer), fits a ``MeasuredLatencyModel``
with its held-out error, and measures the engine's own per-iteration overhead on a short real run. The
result is cached under the cache folder, keyed by what changes iteration times: the CPU (vendor, family,
model and ISA flags, not its marketing name), core count, torch version, model, dtypes, parallel layout, KV
block size and the grid's version.

The grid covers what the schedulers run: mixed batches (a chunk plus up to 64 decodes at short and long
context), whole prompts from context 0 up to 4096 tokens or the context length (vllm, orca and
faster_transformer prefill whole prompts), and 128-256 decodes and long-context decodes as far as the KV
pool holds them. It costs about as much as the 87-point grid before it (~80 s on a 2-core Zen4): the
large points run once, without warm-up, since one of them takes seconds and is its own warm-up.

``$SARATHI_LATENCY_PROFILE`` names a profile file to use instead of this machine's (for CI machines,
which should not spend minutes profiling, and for predicting another machine).

A caller that sets an SLO from the profile right before running (``make demo``) asks for the cached profile
to be checked first: two of its points timed now, and the profile measured again where either is off by
more than ``DRIFT``. A machine's iteration times move after the profile is cached: a Zen5's memory runs in
states whose read rates are 1.3-1.6x apart, and a profile from the faster state put the demo's P99 TBT
(37 ms) over the SLO its budget was chosen for (32 ms).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

from sarathi.config import EngineConfig
from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.cpu_identity import cpu_identity
from sarathi.simulator.measured import MeasuredLatencyModel, Sample, cross_validate, fit

PROFILE_ENV = "SARATHI_LATENCY_PROFILE"
GRID_VERSION = 3  # 3: short points warmed up in every pass (REWARM_TOKENS)
# Mixed batches: a chunk of PREFILL_TOKENS after CONTEXT_LENS cached tokens with DECODE_BATCH_SIZES decodes.
PREFILL_TOKENS = (0, 16, 64, 256, 512)
DECODE_BATCH_SIZES = (0, 1, 4, 16, 32, 64)
CONTEXT_LENS = (128, 1024)
# A coarser layer at a middle context, for the held-out error of the context terms.
MIDDLE_CONTEXT = 512
MIDDLE_PREFILL_TOKENS = (0, 64, 512)
MIDDLE_DECODE_BATCH_SIZES = (0, 16, 64)
# Whole prompts (context 0), as the prefill-first schedulers run them; capped by the context length.
WHOLE_PROMPTS = (64, 256, 512, 1024, 2048, 4096)
# Many decodes, and decodes at long context (kept only where the KV pool holds them).
LONG_DECODES = ((128, 128), (128, 512), (256, 256), (32, 2048), (16, 4096))  # (batch size, context)
# Prefills of at least this many tokens take seconds: timed once, without warm-up.
LARGE_POINT_TOKENS = 1024
OVERHEAD_REQUESTS = 24
# Seconds a profile spends outside the grid (engine start, the overhead run, the fit), for the estimate.
PROFILE_FIXED_SECONDS = 15.0
# Points of at most this many new tokens are warmed up before every timed run, not only the first: after a
# long iteration a short one runs ~1 ms slower on the caches it left (the fit then put the one-sequence
# decode, and the default SLO with it, 20-30% above the engine's real decode iterations on a Zen5).
REWARM_TOKENS = 64
# Points a first fit misses by more than this fraction are timed again, with MISFIT_REPEATS repeats.
MISFIT = 0.25
MISFIT_REPEATS = 5
# Where a cached profile is checked (prefill tokens, decodes, context): the one-sequence decode the default
# SLO is a multiple of, and a mixed iteration of the size the demo's budgets make.
DRIFT_POINTS = ((0, 1, 128), (64, 16, 128))
# A cached profile whose prediction at a DRIFT_POINT is off by more than this fraction is measured again.
DRIFT = 0.2
DRIFT_REPEATS = 5


def cpu_name() -> str:
    """The CPU's marketing name (for people; profiles are keyed on ``cpu_identity``)."""
    return cpu_identity().name


def profile_key(config: EngineConfig) -> dict:
    """What a latency profile depends on."""
    import torch

    from sarathi.model import kernels, quant_path_tuning
    from sarathi.model.loader import effective_quantization

    m, p = config.model, config.parallel
    return {
        "kernels": kernels.source_digest(),
        "kernel_level": kernels.level(),  # SARATHI_KERNELS=avx2 times differently on the same CPU
        "int8_rows": os.environ.get(quant_path_tuning.ENV, "measured"),  # quant_gemm's thresholds
        "quantization": effective_quantization(m),
        "cpu": cpu_identity().key(),
        "grid_version": GRID_VERSION,
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

    vocab = engine.model.vocab_size
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


def profile_grid_points(max_model_len: int) -> tuple[list, list]:
    """The grid as (repeated points, large points): the large ones are timed once. Points past
    ``max_model_len`` are left out; the caller drops those the KV pool cannot hold."""
    from sarathi.benchmark.profiler import GridPoint, grid_points

    contexts = [c for c in CONTEXT_LENS if c + max(PREFILL_TOKENS) <= max_model_len] or [128]
    points = grid_points(PREFILL_TOKENS, DECODE_BATCH_SIZES, contexts)
    if MIDDLE_CONTEXT + max(MIDDLE_PREFILL_TOKENS) <= max_model_len:
        points += grid_points(MIDDLE_PREFILL_TOKENS, MIDDLE_DECODE_BATCH_SIZES, [MIDDLE_CONTEXT])
    prompts = sorted({min(p, max_model_len) for p in WHOLE_PROMPTS})
    points += [GridPoint(p, 0, 0) for p in prompts]
    points += [GridPoint(0, d, c) for d, c in LONG_DECODES if c + 1 <= max_model_len]
    points = list(dict.fromkeys(points))
    large = [p for p in points if _is_large(p)]
    return [p for p in points if not _is_large(p)], large


def _is_large(point) -> bool:
    return point.prefill_tokens >= LARGE_POINT_TOKENS


def predicted_profile_seconds(
    model: LatencyModel, max_model_len: int, fits=lambda point: True, repeats: int = 2
) -> float:
    """How long profiling would take on the machine ``model`` describes (its grid, repeats and warm-ups
    plus ``PROFILE_FIXED_SECONDS``): the one-time cost a fresh machine pays before ``auto`` answers."""
    repeated, large = profile_grid_points(max_model_len)

    def t(point) -> float:
        return model.iteration_time(
            BatchShape.from_grid(point.prefill_tokens, point.decode_batch_size, point.context_len)
        )

    rewarmed = sum(t(p) for p in repeated if fits(p) and p.num_tokens <= REWARM_TOKENS)
    return (
        PROFILE_FIXED_SECONDS
        + (repeats + 1) * sum(t(p) for p in repeated if fits(p))
        + (repeats - 1) * rewarmed
        + sum(t(p) for p in large if fits(p))
    )


def profile_machine(config: EngineConfig, repeats: int = 2, progress: bool = True) -> MeasuredLatencyModel:
    """Profile ``config``'s engine on this machine and return its fitted latency model."""
    from sarathi.benchmark.profiler import check_point, profile_grid

    started = time.monotonic()
    engine = _profiling_engine(config)
    try:
        repeated, large = profile_grid_points(engine.max_model_len)
        repeated = [p for p in repeated if _fits(check_point, engine, p)]
        large = [p for p in large if _fits(check_point, engine, p)]
        results = profile_grid(
            engine, repeated, repeats=repeats, progress=progress, rewarm_tokens=REWARM_TOKENS
        )
        results += profile_grid(engine, large, repeats=1, warmup=0, progress=progress)
        results = remeasure_misfits(
            results,
            lambda points: profile_grid(
                engine, points, repeats=MISFIT_REPEATS, progress=progress, rewarm_tokens=REWARM_TOKENS
            ),
        )
        model = fit_profile(engine, results)
    finally:
        engine.shutdown()
    model.metadata["profiled_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    model.metadata["profile_seconds"] = round(time.monotonic() - started, 1)
    return model


def _profiling_engine(config: EngineConfig):
    """``config``'s engine for timing grid points."""
    from sarathi.executor.assemble import assemble_engine

    # The profiling engine must not itself want an adaptive budget (which would need this profile).
    sched = dataclasses.replace(config.scheduler, adaptive_tbt_slo=None)
    return assemble_engine(dataclasses.replace(config, scheduler=sched))


@dataclasses.dataclass(frozen=True)
class ProfileCheck:
    """A latency profile's predictions beside iteration times measured now, at ``DRIFT_POINTS``."""

    points: tuple[tuple[int, int, int], ...]  # (prefill tokens, decodes, context)
    predicted_s: tuple[float, ...]
    measured_s: tuple[float, ...]

    @property
    def ratios(self) -> tuple[float, ...]:
        """Measured / predicted, per point."""
        return tuple(m / p for m, p in zip(self.measured_s, self.predicted_s, strict=True))

    @property
    def drifted(self) -> bool:
        """Whether any point is off by more than ``DRIFT``."""
        return any(abs(r - 1) > DRIFT for r in self.ratios)

    def describe(self) -> str:
        parts = [
            f"{'decode' if p == 0 else f'{p} tokens +'} {d} at context {c}: {m * 1e3:.1f} ms now, "
            f"{q * 1e3:.1f} predicted ({m / q:.2f}x)"
            for (p, d, c), q, m in zip(self.points, self.predicted_s, self.measured_s, strict=True)
        ]
        return "; ".join(parts) or "no point fits this engine's KV pool, nothing timed"


def check_profile(config: EngineConfig, model: LatencyModel, repeats: int = DRIFT_REPEATS) -> ProfileCheck:
    """``model``'s predictions at ``DRIFT_POINTS`` (those the engine holds) beside ``config``'s engine timed
    there now (median of ``repeats``, short points warmed up in every pass as when profiling)."""
    from sarathi.benchmark.profiler import GridPoint, check_point, profile_grid

    engine = _profiling_engine(config)
    try:
        points = [p for p in (GridPoint(*t) for t in DRIFT_POINTS) if _fits(check_point, engine, p)]
        results = profile_grid(engine, points, repeats=repeats, rewarm_tokens=REWARM_TOKENS)
    finally:
        engine.shutdown()
    shapes = [BatchShape.from_grid(p.prefill_tokens, p.decode_batch_size, p.context_len) for p in points]
    return ProfileCheck(
        points=tuple((p.prefill_tokens, p.decode_batch_size, p.context_len) for p in points),
        predicted_s=tuple(model.iteration_time(shape) for shape in shapes),
        measured_s=tuple(r.median_ms / 1e3 for r in results),
    )


def remeasure_misfits(results: list, measure) -> list:
    """``results`` with the points a first fit misses by more than ``MISFIT`` timed again by
    ``measure(points)`` (prompts of ``LARGE_POINT_TOKENS`` or more are kept: they take seconds each).

    Two repeats of a point are few: a moment of load from elsewhere doubles one point's median and bends
    the whole piecewise fit, the one-sequence decode that the default SLO is a multiple of included
    (measured: a 19.3 ms prediction beside a 13.1 ms decode).
    """
    samples = samples_from_results(results)
    first = fit(samples)
    misfits = [
        r.point
        for r, s in zip(results, samples, strict=True)
        if r.prefill_tokens < LARGE_POINT_TOKENS
        and abs(first.iteration_time(s.shape) / s.seconds - 1) > MISFIT
    ]
    if not misfits:
        return results
    again = {r.point: r for r in measure(misfits)}
    return [again.get(r.point, r) for r in results]


def fit_profile(engine, results) -> MeasuredLatencyModel:
    """The latency model of ``engine`` fitted to profiler ``results``, with the engine's measured
    per-iteration overhead and, in its metadata, the profile key and the 5-fold held-out error."""
    samples = samples_from_results(results)
    model = fit(samples, num_stages=engine.config.parallel.pipeline_parallel_size)
    model.engine_overhead_s = measure_engine_overhead(engine)
    held_out = cross_validate(samples)
    model.metadata = {
        **profile_key(engine.config),
        "cpu_name": cpu_name(),
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


def profile_override() -> Path | None:
    """The profile file ``$SARATHI_LATENCY_PROFILE`` names, if any."""
    value = os.environ.get(PROFILE_ENV)
    return Path(value) if value else None


def machine_profile_path(config: EngineConfig) -> Path:
    """Where ``config``'s latency profile is (or will be): ``$SARATHI_LATENCY_PROFILE`` when it is set and
    has ``config``'s pipeline stages, else this machine's cached profile."""
    override = profile_override()
    if override is not None:
        stages = config.parallel.pipeline_parallel_size
        if MeasuredLatencyModel.load(override).num_stages == stages:
            return override
    return cached_profile_path(config)


def machine_latency_model(
    config: EngineConfig, progress: bool = True, recheck: bool = False
) -> MeasuredLatencyModel:
    """The cached latency model of ``config`` on this machine, profiling (once) when there is none
    (``$SARATHI_LATENCY_PROFILE`` names a profile to use instead, where its pipeline stages match). With
    ``recheck`` a cached profile is first checked against the machine now (``check_profile``) and measured
    again where it has drifted."""
    path = machine_profile_path(config)
    if path != cached_profile_path(config):
        return MeasuredLatencyModel.load(path)
    cached = None
    if path.is_file():
        with contextlib.suppress(ValueError):  # an old or damaged profile: measure again
            cached = MeasuredLatencyModel.load(path)
    if cached is not None:
        if not recheck:
            return cached
        check = check_profile(config, cached)
        if not check.drifted:
            if progress:
                print(f"cached latency profile checked: {check.describe()}", flush=True)
            return cached
        if progress:
            print(
                f"the cached latency profile is more than {DRIFT:.0%} off this machine now "
                f"({check.describe()}): profiling again ({path})",
                flush=True,
            )
    elif progress:
        print(f"no latency profile of this machine for this configuration yet: profiling once ({path})")
    model = profile_machine(config, progress=progress)
    held = model.metadata.get("held_out_error", {})
    if progress and held:
        print(
            f"latency profile: {model.metadata.get('num_points')} points, "
            f"{model.metadata['profile_seconds']} s; "
            f"held-out error median {held['median']:.1%}, p90 {held['p90']:.1%}, max {held['max']:.1%}",
            flush=True,
        )
    model.save(path)
    return model
