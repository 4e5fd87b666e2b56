"""Latency models: how long one iteration of a given batch shape takes, per pipeline stage.

Pure Python. Implementations (in the simulator): a model fitted to ``sarathi profile`` measurements
(``measured.py``) and an analytic roofline model of GPUs we cannot run here (``analytic.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

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
