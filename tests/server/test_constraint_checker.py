"""The constraint checker's helper process: a compile that crashes it (a segfault, as a 5,000-rule chain
did in llguidance) or runs past the timeout is that constraint's error, and the next check gets a fresh
helper. Verdicts are cached per constraint."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from sarathi.entrypoints.openai.constraint_checker import ConstraintChecker
from sarathi.model import embedded_model_path
from sarathi.structured_output import ConstraintError, StructuredOutput, StructuredOutputLimits

VOCAB = 49152
SLOW = StructuredOutput.choice([f"option {i}" for i in range(300_000)])  # ~1 s or more to compile
YES_NO = StructuredOutput.choice(["yes", "no"])


def checker(timeout_s: float) -> ConstraintChecker:
    limits = StructuredOutputLimits(compile_timeout_s=timeout_s)
    return ConstraintChecker(str(embedded_model_path()), VOCAB, (2,), limits)


def test_a_crashing_compile_is_that_constraints_error_and_the_helper_is_replaced():
    async def run():
        c = checker(timeout_s=120)
        await c.start()
        first = c.pid

        async def segfault_soon():
            await asyncio.sleep(0.3)
            os.kill(first, signal.SIGSEGV)

        killer = asyncio.create_task(segfault_soon())
        with pytest.raises(ConstraintError, match="crashed the grammar compiler"):
            await c.check(SLOW)
        await killer
        await c.check(YES_NO)  # a new helper answers
        assert c.pid is not None and c.pid != first and c.num_restarts == 1
        await c.close()

    asyncio.run(run())


def test_a_compile_past_the_timeout_is_refused_and_the_helper_is_replaced():
    async def run():
        c = checker(timeout_s=0.2)
        await c.start()
        first = c.pid
        with pytest.raises(ConstraintError, match=r"took longer than 0\.2 s"):
            await c.check(SLOW)
        # The replacement helper is what is checked here, not its speed: on a loaded 2-core machine even a
        # two-word choice can miss a 0.2 s deadline.
        c.limits = StructuredOutputLimits(compile_timeout_s=60)
        await c.check(YES_NO)
        assert c.pid is not None and c.pid != first and c.num_restarts == 1
        await c.close()

    asyncio.run(run())


def test_verdicts_are_cached_and_bad_constraints_name_the_problem():
    async def run():
        c = checker(timeout_s=60)
        with pytest.raises(ConstraintError, match="admits no output"):
            await c.check(StructuredOutput("grammar", 'start: start "a"'))
        await asyncio.gather(*(c.check(YES_NO) for _ in range(8)))  # compiled once
        pid = c.pid
        os.kill(pid, signal.SIGKILL)  # a cached verdict needs no helper
        await c.check(YES_NO)
        with pytest.raises(ConstraintError, match="admits no output"):
            await c.check(StructuredOutput("grammar", 'start: start "a"'))
        await c.close()

    asyncio.run(run())
