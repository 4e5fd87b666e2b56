"""Save benchmark numbers together with the machine and the commit they were measured on."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from sarathi.cpu_identity import cpu_identity

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict:
    """CPU name and identity (vendor, family, model, ISA flags: a virtual machine's name is often just
    "AMD EPYC"), core count, memory, Python and torch versions, and which of our kernels ran with which
    int8-path thresholds (where the benchmark used them)."""
    cpu = cpu_identity()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import torch

    return {
        "cpu": cpu.name,
        "cpu_identity": cpu.label(),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    } | _kernels_status()


def _kernels_status() -> dict:
    kernels = sys.modules.get("sarathi.model.kernels")  # only where the benchmark loaded them
    status = kernels.status() if kernels is not None else None
    if not status:
        return {}
    if not kernels.portable_available():
        return {"kernels": status}
    # quant_gemm's int8-path threshold by code width, as the benchmark ran (measured here, or the table)
    return {"kernels": status, "int8_rows": {bits: kernels.quant_int8_rows(bits) for bits in (4, 5, 6, 8)}}


def git_commit() -> str:
    """The checked-out commit, with '-dirty' when the tree has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def save_result(name: str, rows: list[dict], settings: dict | None = None) -> Path:
    """Write ``benchmarks/results/<name>-<date>-<commit>.json`` and return its path."""
    commit = git_commit()
    now = datetime.datetime.now(datetime.UTC)
    record = {
        "benchmark": name,
        "date": now.isoformat(timespec="seconds"),
        "commit": commit,
        "machine": machine_info(),
        "settings": settings or {},
        "rows": rows,
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}-{now:%Y%m%d-%H%M%S}-{commit}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
