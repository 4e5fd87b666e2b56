"""Fitting the analytic latency model's ``Calibration`` to published iteration times, and the shipped fit.

Pure Python. ``PAPER_POINTS`` are the Sarathi-Serve paper's (OSDI'24) iteration latencies of Yi-34B on two
A100s (TP2), as quoted in the project's issue 12 (not re-checked against the paper's PDF here); where the
decodes' context is not given, the point says what is assumed.
``calibrate`` minimises the mean squared log error over the points (a pattern search within bounds), with a
weak pull of every fitted field towards its starting value so that fields the points hardly constrain stay
where they were. The points are not all mutually consistent (see ``PaperPoint.note``), so residuals remain.

Regenerate the shipped calibration (``data/analytic_calibration.json``) and print the table::

    python -m sarathi.simulator.analytic_fit --write
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

from sarathi.core.batch_shape import BatchShape
from sarathi.simulator.analytic import CALIBRATION_PATH, EFFICIENCY_FIELDS, AnalyticLatencyModel, Calibration
from sarathi.simulator.hardware import get_hardware
from sarathi.simulator.model_spec import ModelSpec

PAPER = (
    "Agrawal et al., Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve, OSDI'24 "
    "(figures as quoted in issue 12)"
)
TABLE_CONTEXT = 1024  # assumed context of the table's decodes (the paper's hybrid batch holds a 1k prompt)
FIGURE_CONTEXT = 2048  # assumed context of the figure's decodes (the paper does not give one)

# Search bounds: (low, high, searched in log space).
FIELD_BOUNDS: dict[str, tuple[float, float, bool]] = {
    **{name: (0.01, 1.0, True) for name in EFFICIENCY_FIELDS},
    "layer_overhead_s": (0.0, 1e-3, False),
    "iteration_overhead_s": (0.0, 50e-3, False),
}


@dataclass(frozen=True)
class PaperPoint:
    """One published iteration latency: the setup, the batch, the seconds, and what was assumed."""

    label: str
    model: str
    hardware: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    shape: BatchShape
    seconds: float
    note: str = ""

    def latency_model(self, calibration: Calibration) -> AnalyticLatencyModel:
        return AnalyticLatencyModel(
            _spec(self.model),
            get_hardware(self.hardware),
            self.tensor_parallel_size,
            self.pipeline_parallel_size,
            calibration,
        )


def _decodes(n: int, context: int) -> list[tuple[int, int]]:
    return [(context - 1, 1)] * n


def _yi34b_tp2(label: str, chunks: list[tuple[int, int]], ms: float, note: str) -> PaperPoint:
    return PaperPoint(label, "yi-34b", "a100-80gb", 2, 1, BatchShape.from_chunks(chunks), ms / 1e3, note)


PAPER_POINTS: tuple[PaperPoint, ...] = (
    _yi34b_tp2(
        "decode-only, 4 decodes",
        _decodes(4, TABLE_CONTEXT),
        68.1,
        f"table (hybrid vs decode-only batches); decodes at {TABLE_CONTEXT} tokens of context (assumed)",
    ),
    _yi34b_tp2(
        "hybrid, 1021 prefill + 3 decodes",
        [(0, 1021), *_decodes(3, TABLE_CONTEXT)],
        217.6,
        f"table; a fresh 1021-token prompt, decodes at {TABLE_CONTEXT} tokens (assumed)",
    ),
    _yi34b_tp2("prefill-only, 1024 tokens", [(0, 1024)], 217.2, "table; a fresh 1024-token prompt"),
    _yi34b_tp2(
        "decode, batch 1",
        _decodes(1, FIGURE_CONTEXT),
        46.8,
        f"figure (decode iteration time vs batch size); context {FIGURE_CONTEXT} (assumed). 21 ms below the "
        "table's batch of 4, which no roofline explains by 3 more decodes",
    ),
    _yi34b_tp2(
        "decode, batch 128",
        _decodes(128, FIGURE_CONTEXT),
        189.0,
        f"figure; context {FIGURE_CONTEXT} (assumed)",
    ),
)

_SPECS: dict[str, ModelSpec] = {}


def _spec(name: str) -> ModelSpec:
    if name not in _SPECS:
        _SPECS[name] = ModelSpec.load(name)
    return _SPECS[name]


@dataclass(frozen=True)
class PointFit:
    """A point's published and predicted seconds."""

    point: PaperPoint
    predicted_s: float

    @property
    def error(self) -> float:
        """Relative error of the prediction (0.1 = 10% too slow)."""
        return self.predicted_s / self.point.seconds - 1


def evaluate(calibration: Calibration, points: Sequence[PaperPoint] = PAPER_POINTS) -> list[PointFit]:
    """Each point's prediction under ``calibration``."""
    return [PointFit(p, p.latency_model(calibration).iteration_time(p.shape)) for p in points]


def calibrate(
    points: Sequence[PaperPoint] = PAPER_POINTS,
    start: Calibration | None = None,
    fit_fields: Sequence[str] = EFFICIENCY_FIELDS,
    prior_weight: float = 1e-3,
) -> Calibration:
    """The calibration minimising the mean squared log error over ``points``, varying ``fit_fields`` from
    ``start`` (default: the uncalibrated priors) within ``FIELD_BOUNDS``.

    The objective adds ``prior_weight`` × the squared distance of each field from its start (in natural-log
    units for efficiencies, in fractions of the bound's range for overheads): negligible against the
    points' errors, but it keeps fields the points do not constrain from drifting to a bound.
    """
    start = start if start is not None else Calibration()
    unknown = [f for f in fit_fields if f not in FIELD_BOUNDS]
    if unknown:
        raise ValueError(f"cannot fit {', '.join(unknown)} (fittable: {', '.join(FIELD_BOUNDS)})")
    if not points:
        raise ValueError("calibrate needs at least one point")
    names = list(fit_fields)
    x0 = [_to_search(name, getattr(start, name)) for name in names]
    models = [(p, p.latency_model(start)) for p in points]

    def objective(x: list[float]) -> float:
        cal = replace(start, **{n: _from_search(n, v) for n, v in zip(names, x, strict=True)})
        err = sum(
            math.log(model.with_calibration(cal).iteration_time(p.shape) / p.seconds) ** 2
            for p, model in models
        ) / len(models)
        return err + prior_weight * sum((v - v0) ** 2 for v, v0 in zip(x, x0, strict=True))

    best = _pattern_search(objective, x0, [_search_range(n) for n in names])
    return replace(start, **{n: _from_search(n, v) for n, v in zip(names, best, strict=True)})


def _search_range(name: str) -> tuple[float, float]:
    low, high, log = FIELD_BOUNDS[name]
    return (math.log(low), math.log(high)) if log else (0.0, 1.0)


def _to_search(name: str, value: float) -> float:
    low, high, log = FIELD_BOUNDS[name]
    value = min(max(value, low), high)
    return math.log(value) if log else (value - low) / (high - low)


def _from_search(name: str, x: float) -> float:
    low, high, log = FIELD_BOUNDS[name]
    return min(max(math.exp(x), low), high) if log else low + x * (high - low)


def _pattern_search(
    f: Callable[[list[float]], float],
    x0: list[float],
    bounds: list[tuple[float, float]],
    initial_step: float = 0.25,
    tolerance: float = 1e-5,
    max_evaluations: int = 20_000,
) -> list[float]:
    """Minimise ``f`` within box ``bounds`` by compass search: try ± a step along each coordinate, keep
    any improvement, halve the step when none helps."""
    x, fx = list(x0), f(x0)
    steps = [initial_step * (high - low) / (1.0 if high - low <= 1 else 4.0) for low, high in bounds]
    evaluations = 1
    while max(steps) > tolerance and evaluations < max_evaluations:
        improved = False
        for i, (low, high) in enumerate(bounds):
            for sign in (1.0, -1.0):
                trial = list(x)
                trial[i] = min(max(x[i] + sign * steps[i], low), high)
                if trial[i] == x[i]:
                    continue
                ft = f(trial)
                evaluations += 1
                if ft < fx:
                    x, fx, improved = trial, ft, True
                    break
        if not improved:
            steps = [s / 2 for s in steps]
    return x


def format_table(fits: Sequence[PointFit]) -> str:
    """One line per point: published ms, predicted ms, error."""
    lines = [f"{'point':<34} {'paper ms':>9} {'ours ms':>9} {'error':>8}"]
    for fit in fits:
        paper_ms, ours_ms = fit.point.seconds * 1e3, fit.predicted_s * 1e3
        lines.append(f"{fit.point.label:<34} {paper_ms:>9.1f} {ours_ms:>9.1f} {fit.error:>+8.1%}")
    worst = max(abs(fit.error) for fit in fits)
    mean = sum(abs(fit.error) for fit in fits) / len(fits)
    lines.append(f"mean |error| {mean:.1%}, max |error| {worst:.1%}")
    return "\n".join(lines)


def calibration_file(calibration: Calibration, fits: Sequence[PointFit]) -> dict:
    """The shipped calibration file: the calibration, and the points it was fitted to with their errors."""
    return {
        "calibration": calibration.to_json(),
        "fitted_fields": list(EFFICIENCY_FIELDS),
        "generated_by": "python -m sarathi.simulator.analytic_fit --write",
        "source": PAPER,
        "points": [
            {
                "label": fit.point.label,
                "model": fit.point.model,
                "hardware": fit.point.hardware,
                "tensor_parallel_size": fit.point.tensor_parallel_size,
                "pipeline_parallel_size": fit.point.pipeline_parallel_size,
                "paper_ms": round(fit.point.seconds * 1e3, 3),
                "predicted_ms": round(fit.predicted_s * 1e3, 3),
                "error": round(fit.error, 4),
                "note": fit.point.note,
            }
            for fit in fits
        ],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sarathi.simulator.analytic_fit",
        description="Fit the analytic latency model's efficiencies to the Sarathi-Serve paper's iteration "
        "times and print paper vs predicted per point (without --fit: the shipped calibration's table).",
    )
    parser.add_argument("--fit", action="store_true", help="fit from the uncalibrated priors")
    parser.add_argument("--write", action="store_true", help="fit, and write the shipped calibration file")
    args = parser.parse_args(argv)
    if args.fit or args.write:
        calibration = calibrate()
        print("fitted from the uncalibrated priors:")
    else:
        calibration = Calibration.load()
        print(f"shipped calibration ({CALIBRATION_PATH.name}):")
    for f in fields(calibration):
        print(f"  {f.name:<32} {getattr(calibration, f.name):.6g}")
    fits = evaluate(calibration)
    print(format_table(fits))
    if args.write:
        CALIBRATION_PATH.write_text(json.dumps(calibration_file(calibration, fits), indent=2) + "\n")
        print(f"wrote {CALIBRATION_PATH}")


if __name__ == "__main__":
    main()
