"""An executor that runs no model: each step is charged its latency-model time on a simulated clock.

Micro-batches pass through the pipeline stages in order; a stage works on one micro-batch at a time, so a
micro-batch starts a stage when both the previous stage has handed it over and the stage has finished the
micro-batch before it. ``collect`` moves the clock to the end of the oldest micro-batch's last stage, which
is when the real engine would get its tokens back.
"""

from __future__ import annotations

import collections

from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.engine.executor_base import Executor
from sarathi.engine.step_messages import SampledToken, StageTiming, StepInput, StepOutput
from sarathi.simulator.clock import SimulatedClock


class SimulatedExecutor(Executor):
    """Charges each step its latency-model time per pipeline stage; samples ``token_id`` for every row.

    The simulated requests ignore EOS (the benchmark's requests run to their output length), so the token
    id only has to be a valid one.
    """

    def __init__(self, latency_model: LatencyModel, clock: SimulatedClock, token_id: int = 0) -> None:
        self.latency_model = latency_model
        self.clock = clock
        self.token_id = token_id
        self.max_in_flight = latency_model.num_stages
        self._stage_free = [0.0] * latency_model.num_stages
        self._outstanding: collections.deque[tuple[StepInput, float]] = collections.deque()
        self._timings: list[StageTiming] = []

    def submit(self, step: StepInput) -> None:
        if not step.scheduled:  # only grammar jobs: matchers are ready at once, and nothing runs
            self._outstanding.append((step, self.clock.now()))
            return
        shape = BatchShape.from_chunks([(s.start, s.num_tokens) for s in step.scheduled])
        times = self.latency_model.stage_times(shape)
        if len(times) != len(self._stage_free):
            raise ValueError(f"the latency model gave {len(times)} stage times, not {len(self._stage_free)}")
        ready = self.clock.now()
        for stage, seconds in enumerate(times):
            start = max(ready, self._stage_free[stage])
            ready = self._stage_free[stage] = start + seconds
            self._timings.append(StageTiming(step.step_id, stage, start, ready))
        self._outstanding.append((step, ready))

    def collect(self) -> StepOutput:
        step, end = self._outstanding.popleft()
        self.clock.advance_to(end)
        sampled = [SampledToken(self.token_id) for s in step.scheduled if s.samples]
        ready = [job.request_id for job in step.grammar_jobs]
        return StepOutput(step.step_id, sampled, grammars_ready=ready)

    def drain_timings(self) -> list[StageTiming]:
        # Only the timings of collected steps, as the real executors report them.
        done = {step.step_id for step, _ in self._outstanding}
        out = [t for t in self._timings if t.step_id not in done]
        self._timings = [t for t in self._timings if t.step_id in done]
        return out
