"""Build llama.cpp's `llama-server` from the llama-cpp-python sdist (package registry only), once, into the
project cache, and make a BF16 GGUF of the embedded model with `llama-quantize`.

The sdist's `vendor/llama.cpp` is the full llama.cpp source. The web UI is turned off (its build would fetch
it from the network), as are OpenSSL and shared libraries. Only the tools the comparison uses are built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TARGETS = ("llama-server", "llama-quantize", "llama-bench", "llama-batched-bench")
CMAKE_FLAGS = (
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
)


def llama_cpp_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """<cache root>/llama.cpp/<llama-cpp-python version>/ (bin/, the BF16 GGUF, build.json)."""
    from sarathi.model.embedded import cache_root

    return cache_root() / "llama.cpp" / version


def binary(name: str, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return llama_cpp_dir(version) / "bin" / name


def is_built(version: str = LLAMA_CPP_PYTHON_VERSION) -> bool:
    return all(os.access(binary(t, version), os.X_OK) for t in TARGETS)


def cmake_configure_command(src: Path, build: Path) -> list[str]:
    return ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS]


def cmake_build_command(build: Path, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "-j", str(jobs), "--target", *TARGETS]


def sdist_download_command(work: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> list[str]:
    """pip's download of llama-cpp-python's own sdist and nothing else: ``--no-binary`` names only that
    package (``:all:`` would make pip build its build dependencies, scikit-build-core and friends, from
    source to read the sdist's metadata) and ``--no-deps`` skips its runtime dependencies."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-binary",
        "llama-cpp-python",
        "--no-deps",
        "--dest",
        str(work),
        "--quiet",
        f"llama-cpp-python=={version}",
    ]


def _nice(cmd: list[str], niceness: int) -> list[str]:
    return (["nice", "-n", str(niceness)] if niceness and shutil.which("nice") else []) + cmd


def ensure_llama_cpp(version: str = LLAMA_CPP_PYTHON_VERSION, niceness: int = 10, log=print) -> Path:
    """Build the tools once (about 6 minutes on 2 cores) and return the bin/ folder; later calls reuse it."""
    out = llama_cpp_dir(version)
    if is_built(version):
        return out / "bin"
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama.cpp needs {tool} on PATH")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    try:
        log(f"llama.cpp: downloading the llama-cpp-python=={version} sdist from the package registry")
        subprocess.run(sdist_download_command(work, version), check=True)
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            root = sdist.name.removesuffix(".tar.gz")
            head = f"{root}/.git/modules/vendor/llama.cpp/HEAD"  # the submodule's commit
            commit = next(
                (tar.extractfile(m).read().decode().strip() for m in tar.getmembers() if m.name == head),
                "unknown",
            )
            # Without its .git file (a link into the sdist's .git), the tree is plain source.
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.name != prefix + ".git"]
            for m in members:
                m.name = m.name[len(prefix) :]
            tar.extractall(work / "src", members=[m for m in members if m.name], filter="data")
        jobs = os.cpu_count() or 1
        log(
            f"llama.cpp: building {', '.join(TARGETS)} with cmake + ninja on {jobs} cores"
            " (several minutes, once)"
        )
        t0 = time.perf_counter()
        subprocess.run(
            _nice(cmake_configure_command(work / "src", work / "build"), niceness),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            _nice(cmake_build_command(work / "build", jobs), niceness), check=True, stdout=subprocess.DEVNULL
        )
        seconds = time.perf_counter() - t0
        tmp_bin = work / "bin"
        tmp_bin.mkdir()
        for t in TARGETS:
            shutil.copy2(work / "build" / "bin" / t, tmp_bin / t)
        if (out / "bin").exists():
            shutil.rmtree(out / "bin")
        tmp_bin.rename(out / "bin")
        info = {
            "llama_cpp_python": version,
            "llama_cpp_commit": commit,
            "build_seconds": round(seconds),
            "jobs": jobs,
            "cmake_flags": list(CMAKE_FLAGS),
        }
        (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        log(f"llama.cpp: built in {seconds:.0f} s -> {out / 'bin'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out / "bin"


def ensure_bf16_gguf(version: str = LLAMA_CPP_PYTHON_VERSION, log=print) -> Path:
    """The embedded Q4_1 GGUF requantized to BF16 (what sarathi serves from it by default), made once."""
    return ensure_gguf("BF16", version=version, log=log)


def ensure_gguf(
    quant: str, src: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION, log=print
) -> Path:
    """`src` (default: the embedded Q4_1 GGUF) requantized by llama-quantize to `quant` (BF16, Q8_0, Q4_K_M,
    ...), made once; `src` itself when it already is that type."""
    from sarathi.model.embedded import embedded_gguf_path

    src = src or embedded_gguf_path()
    stem, _, shipped = src.stem.rpartition(".")
    if shipped == quant:
        return src
    out = llama_cpp_dir(version) / f"{stem or src.stem}.{quant}.gguf"
    if out.is_file():
        return out
    ensure_llama_cpp(version, log=log)
    tmp = out.with_suffix(".tmp.gguf")
    subprocess.run(
        [str(binary("llama-quantize", version)), "--allow-requantize", str(src), str(tmp), quant],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tmp.rename(out)
    log(f"llama.cpp: wrote {out}")
    return out


def llama_cpp_version(version: str = LLAMA_CPP_PYTHON_VERSION) -> str:
    """The first line of ``llama-server --version`` (build number and commit as the build knows them)."""
    try:
        r = subprocess.run(
            [str(binary("llama-server", version)), "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (r.stdout + r.stderr).strip().splitlines()
    return next((line.strip() for line in lines if line.startswith("version")), "unknown")


def build_info(version: str = LLAMA_CPP_PYTHON_VERSION) -> dict:
    """What build.json recorded: sdist version, llama.cpp commit, build seconds, cores, cmake flags."""
    try:
        return json.loads((llama_cpp_dir(version) / "build.json").read_text())
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    print(ensure_llama_cpp())
    print(ensure_bf16_gguf())
