"""A latency model fitted to ``sarathi profile`` measurements of this machine.

Iteration time is modelled as a piecewise-linear function of the batch's token count (the linear layers:
flat while weight streaming dominates, then growing with compute; the kinks sit at knots spread over the
measured token counts) plus terms linear in the prefill attention work, the decode context and the number
of sequences. It is fitted by least squares on *relative* error (every point weighted by 1 / its time), so
short decode iterations count as much as long prefills. ``cross_validate`` reports the held-out error.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.metrics import percentile

FORMAT_VERSION = 1
_MAX_KNOTS = 6
_MIN_TIME_S = 1e-5


@dataclass(frozen=True)
class Sample:
    """One measured iteration: its shape and its median time in seconds."""

    shape: BatchShape
    seconds: float


@dataclass(frozen=True)
class FitError:
    """Relative error of predictions against measurements (fractions, e.g. 0.05 = 5%)."""

    median: float
    p90: float
    max: float
    num_points: int

    def __str__(self) -> str:
        return (
            f"median {self.median:.1%}, p90 {self.p90:.1%}, max {self.max:.1%} over {self.num_points} points"
        )


@dataclass
class MeasuredLatencyModel(LatencyModel):
    """Fitted coefficients (seconds) over ``features``; ``num_stages`` splits the time evenly.

    ``engine_overhead_s`` is added to every iteration: the engine's own work between iterations
    (scheduling, input preparation, output processing), which the profiler's timings leave out.
    """

    knots: list[float]
    coefficients: list[float]
    num_stages: int = 1
    engine_overhead_s: float = 0.0
    metadata: dict = field(default_factory=dict)

    def iteration_time(self, shape: BatchShape) -> float:
        raw = float(np.dot(self.coefficients, features(shape, self.knots)))
        return max(raw, _MIN_TIME_S) + self.engine_overhead_s

    # --- persistence ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> MeasuredLatencyModel:
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(f"latency profile format {version!r} is not {FORMAT_VERSION}: profile again")
        fields = {k: v for k, v in data.items() if k != "format_version"}
        return cls(**fields)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> MeasuredLatencyModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the latency profile {path}: {e}") from e
        return cls.from_json(data)


FEATURE_NAMES_FIXED = ("constant", "tokens", "prefill_attention", "decode_context", "sequences")


def features(shape: BatchShape, knots: Sequence[float]) -> list[float]:
    """The regression features of ``shape``: constant, tokens, a hinge max(0, tokens - k) per knot, the
    prefill attention work, the decode context and the number of sequences."""
    n = shape.num_tokens
    return [
        1.0,
        float(n),
        *(max(0.0, n - k) for k in knots),
        shape.prefill_attention,
        float(shape.decode_context),
        float(shape.num_seqs),
    ]


def choose_knots(token_counts: Sequence[int]) -> list[float]:
    """Up to ``_MAX_KNOTS`` interior knots, spread over the distinct measured token counts (log-spaced)."""
    distinct = sorted(set(token_counts))
    if len(distinct) < 3:
        return []
    interior = distinct[1:-1]
    if len(interior) <= _MAX_KNOTS:
        return [float(k) for k in interior]
    picks = np.unique(np.round(np.geomspace(1, len(interior), _MAX_KNOTS)).astype(int) - 1)
    return [float(interior[i]) for i in picks]


def fit(
    samples: Sequence[Sample], num_stages: int = 1, knots: Sequence[float] | None = None, ridge: float = 1e-6
) -> MeasuredLatencyModel:
    """Least squares on relative error; ``knots`` default to ``choose_knots`` of the samples."""
    if len(samples) < 2:
        raise ValueError(f"need at least 2 measured points to fit, got {len(samples)}")
    if any(not (s.seconds > 0 and math.isfinite(s.seconds)) for s in samples):
        raise ValueError("every measured time must be a positive number of seconds")
    knots = list(choose_knots([s.shape.num_tokens for s in samples]) if knots is None else knots)
    x = np.array([features(s.shape, knots) for s in samples], dtype=np.float64)
    y = np.array([s.seconds for s in samples], dtype=np.float64)
    # Columns scaled to unit size so the ridge term treats them alike, rows weighted by 1 / time.
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
    xs, w = x / scale, 1.0 / y
    a = xs * w[:, None]
    b = y * w
    gram = a.T @ a + ridge * np.eye(a.shape[1])
    coef = np.linalg.solve(gram, a.T @ b) / scale
    return MeasuredLatencyModel(knots=knots, coefficients=[float(c) for c in coef], num_stages=num_stages)


def relative_errors(model: LatencyModel, samples: Sequence[Sample]) -> list[float]:
    """|predicted - measured| / measured for every sample."""
    return [abs(model.iteration_time(s.shape) - s.seconds) / s.seconds for s in samples]


def summarize_errors(errors: Sequence[float]) -> FitError:
    return FitError(percentile(errors, 50), percentile(errors, 90), max(errors), len(errors))


def cross_validate(samples: Sequence[Sample], folds: int = 5, seed: int = 0) -> FitError:
    """Held-out relative error: each point predicted by a model fitted without its fold (same knots)."""
    if len(samples) < folds * 2:
        raise ValueError(f"need at least {folds * 2} points for {folds}-fold cross-validation")
    knots = choose_knots([s.shape.num_tokens for s in samples])
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    errors: list[float] = []
    for k in range(folds):
        held = set(order[k::folds])
        train = [s for i, s in enumerate(samples) if i not in held]
        model = fit(train, knots=knots)
        errors += relative_errors(model, [samples[i] for i in held])
    return summarize_errors(errors)
