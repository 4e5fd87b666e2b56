"""Latency models: how long one iteration of a given batch shape takes, per pipeline stage.

Pure Python. Implementations: a model fitted to ``sarathi profile`` measurements (``measured.py``), an
analytic roofline model of GPUs we cannot run here (``analytic.py``), and replayed measured times
(``ReplayLatencyModel``), which the replay test uses to hold the simulator to the real engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from sarathi.core.batch_shape import BatchShape


class LatencyModel(ABC):
    """Seconds one iteration of a ``BatchShape`` takes.

    ``stage_times`` splits it over the ``num_stages`` pipeline stages a micro-batch passes through in
    order (each stage's time includes the send of its activations to the next stage).
    """

    num_stages: int = 1

    @abstractmethod
    def iteration_time(self, shape: BatchShape) -> float:
        """Seconds from the first stage's start to the last stage's end, with the pipeline otherwise idle."""

    def stage_times(self, shape: BatchShape) -> list[float]:
        """Seconds spent in each pipeline stage; the default splits the iteration evenly."""
        total = self.iteration_time(shape)
        return [total / self.num_stages] * self.num_stages


class ReplayLatencyModel(LatencyModel):
    """Hands out given iteration times in order, whatever the shape (for replaying a real run)."""

    def __init__(self, times: Iterable[float], num_stages: int = 1) -> None:
        self._times = list(times)
        self._next = 0
        self.num_stages = num_stages

    def iteration_time(self, shape: BatchShape) -> float:
        if self._next >= len(self._times):
            raise IndexError(f"the replay ran out of iteration times after {len(self._times)} iterations")
        t = self._times[self._next]
        self._next += 1
        return t
