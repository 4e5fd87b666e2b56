"""The llama.cpp build downloads llama-cpp-python's own sdist and nothing else (checked without running)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import llama_cpp_build as build


def test_the_download_is_only_llama_cpp_pythons_sdist(tmp_path):
    cmd = build.sdist_download_command(tmp_path, "0.3.36")
    assert cmd == [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-binary",
        "llama-cpp-python",
        "--no-deps",
        "--dest",
        str(tmp_path),
        "--quiet",
        "llama-cpp-python==0.3.36",
    ]
    # ":all:" would have pip build scikit-build-core and the other build dependencies from source.
    assert ":all:" not in cmd


def test_ensure_llama_cpp_runs_that_download(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "llama_cpp_dir", lambda version=None: tmp_path / "llama.cpp")
    monkeypatch.setattr(build.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    ran = []

    def fake_run(cmd, **kwargs):
        ran.append(cmd)
        raise subprocess.CalledProcessError(1, cmd)  # stop before anything is unpacked or built

    monkeypatch.setattr(build.subprocess, "run", fake_run)
    with pytest.raises(subprocess.CalledProcessError):
        build.ensure_llama_cpp("0.3.36", log=lambda *a: None)
    (cmd,) = ran
    work = Path(cmd[cmd.index("--dest") + 1])
    assert cmd == build.sdist_download_command(work, "0.3.36")
    assert work.parent == tmp_path / "llama.cpp" and not work.exists()  # the scratch folder is removed
