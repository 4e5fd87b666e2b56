"""The executor seam: the engine hands each scheduled step to an ``Executor`` and gets sampled tokens back.

Steps are submitted and collected in FIFO order; up to ``max_in_flight`` may be outstanding (the number
of pipeline stages), so the scheduler can plan the next micro-batch while earlier ones run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sarathi.engine.step_messages import StageTiming, StepInput, StepOutput


class WorkerFailedError(RuntimeError):
    """A worker died, hung or raised: the executor cannot go on. The message names the rank."""


class Executor(ABC):
    """Runs steps on the workers that hold the model."""

    #: How many submitted steps may be outstanding before the oldest must be collected.
    max_in_flight: int = 1

    @abstractmethod
    def submit(self, step: StepInput) -> None:
        """Start ``step`` (it may run asynchronously)."""

    @abstractmethod
    def collect(self) -> StepOutput:
        """The output of the oldest outstanding step (blocks until it is there).

        Raises ``WorkerFailedError`` if the workers are gone; any other exception failed only this step.
        """

    def execute(self, step: StepInput) -> StepOutput:
        """Submit ``step`` and wait for its output."""
        self.submit(step)
        return self.collect()

    def drain_timings(self) -> list[StageTiming]:
        """Per-stage start/end times of the steps collected since the last call."""
        return []

    @property
    def worker_pids(self) -> list[int]:
        """Worker processes on this machine (none when the model runs in the engine's process)."""
        return []

    def check_health(self) -> None:  # noqa: B027 (nothing to check where there are no workers)
        """Raise ``WorkerFailedError`` if a worker is gone."""

    def shutdown(self) -> None:  # noqa: B027 (in-process workers need no stopping)
        """Stop the workers and free what they hold; safe to call twice."""
