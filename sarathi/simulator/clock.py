"""Clocks the engine's loop reads: the wall clock, or a simulated one that only moves when told to."""

from __future__ import annotations


class SimulatedClock:
    """Simulated seconds: ``now`` returns the current time; ``advance_to`` moves it forward (never back)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t > self._now:
            self._now = float(t)
