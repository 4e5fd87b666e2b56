"""llama.cpp's own forward-pass benchmarks on the BF16 GGUF of the embedded model, at the shapes of
benchmarks/model_forward.py, so both are measured in one run on one machine.

- prefill T: ``llama-bench -p T -n 0 -b T -ub T`` (one T-token batch from position 0), ms = T / tokens per s;
- decode B: ``llama-batched-bench -npp CONTEXT -ntg N -npl B`` (B sequences, each with its own CONTEXT-token
  prompt, then N decode steps of all B at once), ms per step = T_TG / N. Its context grows from CONTEXT to
  CONTEXT + N during the steps (N is small, so ~1.5% more K/V than our fixed CONTEXT).

llama.cpp has no benchmark of a mixed chunk + decodes batch, so that shape has no llama.cpp number.
Both tools run with the thread count torch uses (``-t``), and are timed with the same foreign-load guard.

Where a tool crashes on a file with its defaults (on an Intel Xeon with AMX, llama.cpp 0.3.36 moves
k-quant weights into its AMX buffers and its AMX matmul segfaults: ggml-org/llama.cpp#20824), it is run again
with its weight repacking off (``--repack 0`` / ``--no-repack``: its AMX and repacked-layout kernels), which
is what a user of that machine can run; the command recorded says so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cpu_load import busy_seconds, children_seconds, foreign_load, own_seconds

DECODE_STEPS = 16


@dataclass(frozen=True)
class LlamaCppTime:
    """One llama.cpp measurement: median ms per forward over its repetitions, and the worst foreign load."""

    case: str
    ms: float
    foreign_load: float
    command: str


def parse_llama_bench(stdout: str) -> dict[int, float]:
    """``llama-bench -o json`` -> {prompt tokens: ms per prefill batch} for its prompt-only tests."""
    out = {}
    for test in json.loads(stdout[stdout.index("[") :]):
        if test.get("n_gen", 0) == 0 and test.get("n_prompt", 0) > 0:
            out[int(test["n_prompt"])] = float(test["avg_ns"]) / 1e6
    return out


def parse_batched_bench(stdout: str) -> dict[int, float]:
    """``llama-batched-bench --output-format jsonl`` -> {parallel sequences: ms per decode step of all}."""
    out = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "t_tg" in row and row.get("tg"):
            out[int(row["pl"])] = float(row["t_tg"]) * 1e3 / int(row["tg"])
    return out


class LlamaCppCrashed(RuntimeError):
    """A llama.cpp tool ended by a signal (a segfault), not with an error of its own."""


#: Each tool's flags that turn llama.cpp's weight repacking (its AMX and repacked-layout kernels) off.
NO_REPACK = {
    "llama-bench": ("--repack", "0"),
    "llama-batched-bench": ("--no-repack",),
    "llama-server": ("--no-repack",),
}
_crashed: set[tuple[str, str]] = set()  # (tool, model file) that crashed with repacking on, in this process


def run_or_without_repack(cmd: list[str], max_foreign: float, log=print) -> tuple[str, float, list[str]]:
    """`run_guarded`, and where the tool crashes on its model file with repacking on, again with it off (once
    it has crashed on a file, straight away): (stdout, foreign load, the command that ran)."""
    tool, model = Path(cmd[0]).name, cmd[cmd.index("-m") + 1]
    if (tool, model) not in _crashed:
        try:
            return (*run_guarded(cmd, max_foreign), cmd)
        except LlamaCppCrashed as exc:
            _crashed.add((tool, model))
            log(f"llama.cpp: {exc}; again with its weight repacking off ({' '.join(NO_REPACK[tool])})")
    retry = [*cmd, *NO_REPACK[tool]]
    return (*run_guarded(retry, max_foreign), retry)


def repack_crashes(bench: Path, gguf: Path, threads: int = 2, log=print) -> bool:
    """Whether llama.cpp crashes on ``gguf`` with its weight repacking on: one short ``llama-bench`` prefill
    (seconds), asked once per file in this process. Servers then run with ``--no-repack``."""
    key = ("llama-bench", str(gguf))
    if key not in _crashed:
        if not Path(bench).is_file():  # not built: nothing to ask
            return False
        cmd = [str(bench), "-m", str(gguf), "-t", str(threads), "-p", "16", "-n", "0", "-r", "1"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode >= 0:
            return False
        _crashed.add(key)
        log(f"llama.cpp: llama-bench crashed (signal {-done.returncode}) on {gguf} with repacking on")
    return True


def run_guarded(cmd: list[str], max_foreign: float, tries: int = 3) -> tuple[str, float]:
    """Run ``cmd`` to completion (stdout, worst-accepted foreign load), repeating it when other processes
    used more than ``max_foreign`` of the machine meanwhile (its own and our CPU time do not count)."""
    ncpu = os.cpu_count() or 1
    foreign = 0.0
    for _ in range(tries):
        busy0, kids0, own0, t0 = busy_seconds(), children_seconds(), own_seconds(), time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode < 0:
            model = cmd[cmd.index("-m") + 1]
            raise LlamaCppCrashed(f"{Path(cmd[0]).name} crashed (signal {-done.returncode}) on {model}")
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0]).name} failed ({done.returncode}): {done.stderr[-800:]}")
        ours = (children_seconds() - kids0) + (own_seconds() - own0)
        foreign = foreign_load(busy_seconds() - busy0, ours, 0.0, wall, ncpu)
        if foreign <= max_foreign:
            break
    return done.stdout, foreign


def prefill_times(
    bench: Path, gguf: Path, tokens: list[int], threads: int, reps: int, max_foreign: float
) -> list[LlamaCppTime]:
    """``llama-bench`` prompt processing of each T in ``tokens`` as one batch of T, median of ``reps``."""
    out = []
    for t in tokens:
        cmd = [str(bench), "-m", str(gguf), "-t", str(threads), "-p", str(t), "-n", "0"]
        cmd += ["-b", str(t), "-ub", str(t), "-r", str(reps), "-o", "json"]
        stdout, load, ran = run_or_without_repack(cmd, max_foreign)
        out.append(LlamaCppTime(f"prefill T={t}", parse_llama_bench(stdout)[t], load, " ".join(ran[1:])))
    return out


def decode_times(
    batched_bench: Path,
    gguf: Path,
    batches: list[int],
    context: int,
    threads: int,
    reps: int,
    max_foreign: float,
) -> list[LlamaCppTime]:
    """``llama-batched-bench`` decode steps of B sequences at ``context`` cached tokens each, per B in
    ``batches``; the median over ``reps`` runs of the tool (each run prefills anew)."""
    out = []
    for b in batches:
        n_kv = b * (context + DECODE_STEPS)
        cmd = [str(batched_bench), "-m", str(gguf), "-t", str(threads), "-c", str(n_kv)]
        cmd += ["-b", "2048", "-ub", "512", "-npp", str(context), "-ntg", str(DECODE_STEPS), "-npl", str(b)]
        cmd += ["--output-format", "jsonl"]
        times, worst, ran = [], 0.0, cmd
        for _ in range(reps):
            stdout, load, ran = run_or_without_repack(cmd, max_foreign)
            times.append(parse_batched_bench(stdout)[b])
            worst = max(worst, load)
        out.append(LlamaCppTime(f"decode B={b}", statistics.median(times), worst, " ".join(ran[1:])))
    return out
