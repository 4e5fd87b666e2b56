"""Per-stage timelines of a run: a Chrome / Perfetto ``trace.json`` and the pipeline bubble fraction.

Each pipeline stage (its tensor-parallel rank 0) reports when it started and ended every micro-batch
(``StageTiming``, monotonic clock shared by the processes of one machine). A stage is idle between its
micro-batches: waiting for the previous stage's activations or for the engine's next step. Open the trace
at https://ui.perfetto.dev or chrome://tracing. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sarathi.engine.step_messages import StageTiming
from sarathi.outputs import IterationStats


def bubble_fractions(timings: Sequence[StageTiming]) -> list[float]:
    """Per stage: idle time / wall time, wall time being the span from the first micro-batch start to the
    last micro-batch end over all stages (so a stage that starts late counts its wait as bubble)."""
    if not timings:
        return []
    span = max(t.end for t in timings) - min(t.start for t in timings)
    stages = sorted({t.stage for t in timings})
    busy = {s: sum(t.end - t.start for t in timings if t.stage == s) for s in stages}
    return [1.0 - busy[s] / span if span > 0 else math.nan for s in stages]


def chrome_trace(timings: Sequence[StageTiming], iterations: Sequence[IterationStats] = ()) -> dict:
    """Trace events: one row per pipeline stage with a slice per micro-batch, and one row with each
    micro-batch's life in the engine (submitted until its tokens came back)."""
    t0 = min([t.start for t in timings] + [it.start_time for it in iterations], default=0.0)
    by_step = {it.step_id: it for it in iterations}
    events: list[dict] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "sarathi pipeline"}},
        {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "engine: micro-batches"}},
    ]
    for stage in sorted({t.stage for t in timings}):
        name = {"name": f"stage {stage}"}
        events.append({"ph": "M", "pid": 1, "tid": stage + 1, "name": "thread_name", "args": name})
    for t in timings:
        it = by_step.get(t.step_id)
        args = {"step": t.step_id}
        if it is not None:
            args |= {"prefill_tokens": it.num_prefill_tokens, "decode_tokens": it.num_decode_tokens}
        events.append(_slice(f"step {t.step_id}", t.stage + 1, t.start - t0, t.end - t.start, args))
    for it in iterations:
        args = {"prefill_tokens": it.num_prefill_tokens, "decode_tokens": it.num_decode_tokens}
        events.append(_slice(f"step {it.step_id}", 0, it.start_time - t0, it.wall_time, args))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _slice(name: str, tid: int, start_s: float, duration_s: float, args: dict) -> dict:
    return {
        "ph": "X",
        "pid": 1,
        "tid": tid,
        "name": name,
        "ts": start_s * 1e6,
        "dur": duration_s * 1e6,
        "args": args,
    }
