"""Offline parallelism from a plain script: three lines in a file, no ``if __name__ == "__main__":`` guard.

Workers must not re-import the user's main script (multiprocessing's spawn would run it again in every
worker, which then fails to bootstrap); run as a file, the script prints what one process prints.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import sarathi

SCRIPT = """from sarathi import LLM, SamplingParams
llm = LLM({parallel}dtype="float32", num_kv_blocks=64)
print(repr(llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))[0].text))
"""


def _run_script(tmp_path, parallel: str) -> str:
    path = tmp_path / "plain_script.py"
    path.write_text(SCRIPT.format(parallel=parallel))
    # The sarathi under test, wherever it is imported from.
    root = os.path.dirname(os.path.dirname(os.path.abspath(sarathi.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    # One intra-op thread, as each of the two workers has on 2 cores: two OpenMP threads of one process
    # on a loaded machine spin at every barrier (8 tokens took 70 s instead of 1.3 s beside other jobs).
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> str:
    return _run_script(tmp_path_factory.mktemp("tp1"), "")


@pytest.mark.parametrize("parallel", ["tensor_parallel_size=2, ", "pipeline_parallel_size=2, "])
def test_a_plain_script_runs_with_parallel_workers(tmp_path, one_process, parallel):
    assert _run_script(tmp_path, parallel) == one_process
