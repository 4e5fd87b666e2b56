"""The default for one rank: the worker lives in the engine's own process and runs steps synchronously."""

from __future__ import annotations

import collections

from sarathi.config import EngineConfig
from sarathi.engine.executor_base import Executor
from sarathi.engine.step_messages import StageTiming, StepInput, StepOutput
from sarathi.worker.worker import Worker


class UniProcExecutor(Executor):
    """Runs each step on an in-process ``Worker`` at submit time; ``collect`` hands the results back."""

    max_in_flight = 1

    def __init__(self, config: EngineConfig, num_kv_blocks: int, eos_token_ids: tuple[int, ...]) -> None:
        self.worker = Worker(config, num_kv_blocks, eos_token_ids)
        self._results: collections.deque[StepOutput | Exception] = collections.deque()
        self._timings: list[StageTiming] = []

    def submit(self, step: StepInput) -> None:
        try:
            output, timing = self.worker.execute(step)
        except Exception as e:  # reported by collect(): the engine fails this step's requests only
            self._results.append(e)
            return
        self._timings.append(timing)
        self._results.append(output)

    def collect(self) -> StepOutput:
        result = self._results.popleft()
        if isinstance(result, Exception):
            raise result
        return result

    def drain_timings(self) -> list[StageTiming]:
        timings, self._timings = self._timings, []
        return timings
