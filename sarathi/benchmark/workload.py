"""Benchmark workloads: request lengths (trace files or synthetic), arrival times and prompt token ids.

Lengths come from a trace CSV (``num_prefill_tokens``, ``num_decode_tokens`` and, for the Splitwise
traces, ``arrived_at``) or a synthetic distribution; ``length_scale`` multiplies them and
``max_total_tokens`` caps prompt + output (both shrunk in proportion) so paper-scale traces fit a small
CPU. Arrivals are Poisson, gamma (a given coefficient of variation), or the trace's own timestamps
(rescaled to ``qps`` when one is given). Every random choice comes from one seed.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

BUILTIN_TRACES = {
    "sharegpt": "sharegpt_8k_llama2_tokenizer.csv",
    "arxiv": "arxiv_summarization_4k_llama2_tokenizer.csv",
    "splitwise_conv": "splitwise_conv.csv",
    "splitwise_code": "splitwise_code.csv",
}
SYNTHETIC = "synthetic"
ARRIVALS = ("poisson", "gamma", "trace")
LENGTH_DISTRIBUTIONS = ("fixed", "uniform", "zipf")


@dataclass(frozen=True)
class SyntheticLengths:
    """Synthetic prompt/output lengths: ``fixed`` (the max values), ``uniform`` or ``zipf`` in [min, max]."""

    distribution: str = "fixed"
    prompt_min: int = 32
    prompt_max: int = 256
    output_min: int = 16
    output_max: int = 128
    zipf_theta: float = 1.1

    def __post_init__(self) -> None:
        if self.distribution not in LENGTH_DISTRIBUTIONS:
            raise ValueError(
                f"unknown length distribution {self.distribution!r}; "
                f"choose one of: {', '.join(LENGTH_DISTRIBUTIONS)}"
            )
        if not 1 <= self.prompt_min <= self.prompt_max:
            raise ValueError(f"need 1 <= prompt_min <= prompt_max, got {self.prompt_min}, {self.prompt_max}")
        if not 1 <= self.output_min <= self.output_max:
            raise ValueError(f"need 1 <= output_min <= output_max, got {self.output_min}, {self.output_max}")
        if self.zipf_theta <= 0:
            raise ValueError(f"zipf_theta must be > 0, got {self.zipf_theta}")


@dataclass(frozen=True)
class WorkloadConfig:
    """What to generate: lengths, their scaling, arrivals and how many requests.

    ``trace`` is a built-in name (``sharegpt``, ``arxiv``, ``splitwise_conv``, ``splitwise_code``),
    ``synthetic``, or a path to a CSV with the same columns. ``qps`` None means every request arrives at
    time 0 (poisson/gamma) or the trace's own rate (trace).
    """

    trace: str = "sharegpt"
    num_requests: int = 100
    qps: float | None = 1.0
    arrival: str = "poisson"
    cv: float = 1.0
    length_scale: float = 1.0
    max_total_tokens: int | None = None
    seed: int = 0
    synthetic: SyntheticLengths = SyntheticLengths()

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.arrival not in ARRIVALS:
            raise ValueError(
                f"unknown arrival process {self.arrival!r}; choose one of: {', '.join(ARRIVALS)}"
            )
        if self.qps is not None and not (self.qps > 0 and math.isfinite(self.qps)):
            raise ValueError(f"qps must be a positive number, got {self.qps}")
        if self.cv <= 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")
        if self.length_scale <= 0:
            raise ValueError(f"length_scale must be > 0, got {self.length_scale}")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError(f"max_total_tokens must be >= 2, got {self.max_total_tokens}")
        if self.arrival == "trace" and self.trace == SYNTHETIC:
            raise ValueError("arrival 'trace' needs a trace with an arrived_at column, not 'synthetic'")


@dataclass(frozen=True)
class TraceRow:
    """One row of a length trace; ``arrived_at`` is None when the trace has no timestamps."""

    num_prefill_tokens: int
    num_decode_tokens: int
    arrived_at: float | None = None


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: when it arrives (seconds after the start) and its exact lengths."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    prompt_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenSpace:
    """Token ids a benchmark prompt may use: ``[0, vocab_size)`` minus special and EOS ids."""

    vocab_size: int
    excluded: frozenset[int] = frozenset()

    def allowed(self) -> np.ndarray:
        ids = np.arange(self.vocab_size)
        return ids[~np.isin(ids, np.fromiter(self.excluded, dtype=np.int64, count=len(self.excluded)))]

    @classmethod
    def of_folder(cls, folder: str | os.PathLike) -> TokenSpace:
        """From a Hugging Face model folder: config.json's vocab size and EOS ids, tokenizer.json's
        added (special) tokens. Reads no weights."""
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        excluded = set(_ids(config.get("eos_token_id"))) | set(_ids(config.get("bos_token_id")))
        gen = folder / "generation_config.json"
        if gen.is_file():
            excluded |= set(_ids(json.loads(gen.read_text()).get("eos_token_id")))
        tok = folder / "tokenizer.json"
        if tok.is_file():
            excluded |= {t["id"] for t in json.loads(tok.read_text()).get("added_tokens", [])}
        return cls(int(config["vocab_size"]), frozenset(excluded))

    @classmethod
    def of_engine(cls, engine) -> TokenSpace:
        """From a loaded ``LLMEngine``: its vocabulary minus its EOS ids and its tokenizer's special ids."""
        excluded = set(engine.eos_token_ids)
        if engine.tokenizer is not None:
            excluded |= set(cls.of_folder(engine.tokenizer.folder).excluded)
        return cls(int(engine.model.vocab_size), frozenset(excluded))


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def trace_path(trace: str) -> Path:
    """The CSV of a built-in trace name, or ``trace`` itself as a path."""
    if trace in BUILTIN_TRACES:
        return Path(str(resources.files("sarathi") / "data" / "traces" / BUILTIN_TRACES[trace]))
    path = Path(trace)
    if not path.is_file():
        raise ValueError(
            f"trace {trace!r} is neither a file nor a built-in trace "
            f"({', '.join([*BUILTIN_TRACES, SYNTHETIC])})"
        )
    return path


def load_trace(trace: str) -> list[TraceRow]:
    """Rows of a trace CSV (``num_prefill_tokens``, ``num_decode_tokens`` and optional ``arrived_at``)."""
    path = trace_path(trace)
    stat = path.stat()
    return list(_read_trace(path.resolve(), stat.st_mtime_ns, stat.st_size))


# A token-budget search generates its workload once per simulated run (65 for the demo's plan): parsing a
# 30,000-row trace each time was over a third of that plan's time. Keyed by the file's time and size, so an
# edited trace is read again.
@functools.lru_cache(maxsize=8)
def _read_trace(path: Path, mtime_ns: int, size: int) -> tuple[TraceRow, ...]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"num_prefill_tokens", "num_decode_tokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"trace {path} lacks column(s) {', '.join(sorted(missing))}")
        timed = "arrived_at" in (reader.fieldnames or ())
        rows = [
            TraceRow(
                int(float(r["num_prefill_tokens"])),
                int(float(r["num_decode_tokens"])),
                float(r["arrived_at"]) if timed else None,
            )
            for r in reader
        ]
    if not rows:
        raise ValueError(f"trace {path} has no rows")
    return tuple(rows)


def scale_lengths(prompt: int, output: int, scale: float, max_total: int | None) -> tuple[int, int]:
    """Multiply both lengths by ``scale`` (at least 1 token each), then shrink both in proportion so
    prompt + output <= ``max_total``."""
    p, d = max(1, round(prompt * scale)), max(1, round(output * scale))
    if max_total is not None and p + d > max_total:
        f = max_total / (p + d)
        p, d = max(1, math.floor(p * f)), max(1, math.floor(d * f))
        p = min(p, max_total - d)
    return p, d


def _synthetic_lengths(spec: SyntheticLengths, n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    def draw(lo: int, hi: int) -> np.ndarray:
        if spec.distribution == "fixed":
            return np.full(n, hi)
        if spec.distribution == "uniform":
            return rng.integers(lo, hi + 1, size=n)
        # Zipf over the hi-lo+1 lengths: length lo + k - 1 has weight 1 / k**theta (short ones common).
        k = np.arange(1, hi - lo + 2, dtype=np.float64)
        w = k**-spec.zipf_theta
        return lo + rng.choice(len(k), size=n, p=w / w.sum())

    prompts, outputs = draw(spec.prompt_min, spec.prompt_max), draw(spec.output_min, spec.output_max)
    return [(int(p), int(d)) for p, d in zip(prompts, outputs, strict=True)]


def arrival_times(
    n: int, arrival: str, qps: float | None, cv: float, rng: np.random.Generator, trace_times=None
) -> list[float]:
    """Arrival offsets (seconds, non-decreasing, the first at 0 for a trace, else after one gap)."""
    if arrival == "trace":
        if trace_times is None or any(t is None for t in trace_times):
            raise ValueError("arrival 'trace' needs a trace with an arrived_at column")
        t = np.asarray(trace_times, dtype=np.float64)
        t = t - t[0]
        if qps is not None and n > 1 and t[-1] > 0:
            t = t * ((n - 1) / t[-1]) / qps  # rescale to a mean rate of qps
        return [float(x) for x in t]
    if qps is None:
        return [0.0] * n
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / qps, size=n)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (qps * shape), size=n)
    return [float(x) for x in np.cumsum(gaps)]


def generate_workload(config: WorkloadConfig, token_space: TokenSpace | None = None) -> list[BenchRequest]:
    """The requests of ``config``, sorted by arrival; with ``token_space``, each gets prompt token ids.

    Splitwise traces are read in order from their first row (their timestamps belong to that order);
    other traces are shuffled with the seed and cycled when more requests than rows are asked for.
    """
    rng = np.random.default_rng(config.seed)
    n = config.num_requests
    times = None
    if config.trace == SYNTHETIC:
        lengths = _synthetic_lengths(config.synthetic, n, rng)
    else:
        rows = load_trace(config.trace)
        timed = rows[0].arrived_at is not None
        order = np.arange(len(rows)) if timed else rng.permutation(len(rows))
        picked = [rows[order[i % len(rows)]] for i in range(n)]
        if timed and n > len(rows) and config.arrival == "trace":
            raise ValueError(f"trace {config.trace} has only {len(rows)} timed rows, asked for {n}")
        lengths = [(r.num_prefill_tokens, r.num_decode_tokens) for r in picked]
        times = [r.arrived_at for r in picked]
    lengths = [scale_lengths(p, d, config.length_scale, config.max_total_tokens) for p, d in lengths]
    arrivals = arrival_times(n, config.arrival, config.qps, config.cv, rng, times)
    allowed = token_space.allowed() if token_space is not None else None
    if allowed is not None and len(allowed) == 0:
        raise ValueError("the token space allows no token ids")
    requests = []
    for i, ((p, d), t) in enumerate(zip(lengths, arrivals, strict=True)):
        ids = () if allowed is None else tuple(int(x) for x in allowed[rng.integers(0, len(allowed), size=p)])
        requests.append(BenchRequest(f"req-{i}", t, p, d, ids))
    return sorted(requests, key=lambda r: r.arrival_time)
