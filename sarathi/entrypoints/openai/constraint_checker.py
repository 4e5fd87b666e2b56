"""Compiles each request's structured-output constraint in a helper process before the engine sees it.

A grammar library is native code: a hostile grammar can overflow its stack (a segfault) or keep it busy
for a minute. So the API process never compiles one itself. A long-lived helper process holds the model's
llguidance tokenizer and compiles one constraint at a time, each on a big-stack thread; the API awaits its
one-line verdict without blocking the event loop. A helper that crashes or runs past the timeout is
killed and replaced for the next request, and the request that did it gets a 400. Verdicts are cached by
constraint, so a schema used by many requests is compiled here once.

Run as ``python -m sarathi.entrypoints.openai.constraint_checker TOKENIZER_DIR VOCAB_SIZE EOS_IDS``: JSON
lines ``{"kind", "spec"}`` in, ``{"error": null | message}`` out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import sys

from sarathi.structured_output import ConstraintError, StructuredOutput, StructuredOutputLimits

_CACHED_VERDICTS = 256
_STARTUP_TIMEOUT_S = 120.0  # importing llguidance and loading the tokenizer, not counted as compile time


class ConstraintChecker:
    """Compiles constraints in a helper process (started on first use, replaced after a crash)."""

    def __init__(
        self,
        tokenizer_dir: str,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        limits: StructuredOutputLimits | None = None,
    ) -> None:
        self.limits = limits or StructuredOutputLimits()
        self._args = [tokenizer_dir, str(vocab_size), ",".join(map(str, eos_token_ids))]
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._verdicts: collections.OrderedDict[tuple[str, str], str | None] = collections.OrderedDict()
        self.num_restarts = 0

    async def start(self) -> None:
        """Start the helper process now rather than at the first constrained request."""
        async with self._lock:
            await self._helper()

    async def check(self, constraint: StructuredOutput) -> None:
        """Raise ConstraintError if ``constraint`` does not compile, crashes the compiler or takes longer
        than ``limits.compile_timeout_s``."""
        key = (constraint.kind, constraint.spec)
        if key not in self._verdicts:
            async with self._lock:  # one compile at a time: the helper is single-threaded
                if key not in self._verdicts:  # (another request may have compiled it meanwhile)
                    self._verdicts[key] = await self._compile(constraint)
                    if len(self._verdicts) > _CACHED_VERDICTS:
                        self._verdicts.popitem(last=False)
        self._verdicts.move_to_end(key)
        if (error := self._verdicts[key]) is not None:
            raise ConstraintError(error)

    async def _compile(self, constraint: StructuredOutput) -> str | None:
        """The helper's verdict on ``constraint`` (None: it compiles). A helper that does not start raises
        ConstraintError (not a verdict on this constraint: not cached)."""
        proc = await self._helper()
        line = json.dumps({"kind": constraint.kind, "spec": constraint.spec}) + "\n"
        try:
            proc.stdin.write(line.encode())
            await proc.stdin.drain()
            reply = await asyncio.wait_for(proc.stdout.readline(), self.limits.compile_timeout_s)
        except TimeoutError:
            await self._discard()
            return (
                f"the constraint took longer than {self.limits.compile_timeout_s:g} s to compile "
                "(--structured-output-compile-timeout); simplify it"
            )
        except (BrokenPipeError, ConnectionResetError):
            reply = b""
        if not reply:  # the helper died on this constraint
            code = await self._discard()
            return f"the constraint crashed the grammar compiler (exit code {code}); simplify it"
        return json.loads(reply)["error"]

    async def _helper(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                __name__,
                *self._args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                ready = await asyncio.wait_for(self._proc.stdout.readline(), _STARTUP_TIMEOUT_S)
            except TimeoutError:
                ready = b""
            if not ready:
                code = await self._discard()
                raise ConstraintError(f"the grammar compiler did not start (exit code {code})")
        return self._proc

    async def _discard(self) -> int | None:
        """Kill the helper (if still alive); the next check starts a new one. Its exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        self.num_restarts += 1
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        return await proc.wait()

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    @property
    def pid(self) -> int | None:
        """The helper process, if one is running."""
        return None if self._proc is None or self._proc.returncode is not None else self._proc.pid


def _serve(tokenizer_dir: str, vocab_size: str, eos_ids: str) -> None:
    from sarathi.structured_output import check_compiles, llg_tokenizer

    eos = tuple(int(t) for t in eos_ids.split(",") if t)
    tokenizer = llg_tokenizer(tokenizer_dir, int(vocab_size), eos)
    check_compiles(tokenizer, StructuredOutput.choice(["ready"]))  # one-off costs not counted as compile time
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            check_compiles(tokenizer, StructuredOutput(request["kind"], request["spec"]))
            error = None
        except ConstraintError as e:
            error = str(e)
        except Exception as e:  # anything else the library raises is this constraint's fault too
            error = f"the constraint does not compile: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        sys.stdout.write(json.dumps({"error": error}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
