"""Which CPU this is, precisely enough to key a latency profile: vendor, family, model and the ISA flags
that change which kernels run (AVX2, AVX-512, AVX512-VNNI, AVX512-BF16, AMX).

The marketing name is not enough: virtual machines often report "AMD EPYC" or "Intel Xeon Processor" for
several generations whose iteration times differ by 2x.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from pathlib import Path

#: ISA flags (as /proc/cpuinfo spells them) that decide which GEMM / attention paths run.
RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclass(frozen=True)
class CpuIdentity:
    """A CPU's vendor, family and model numbers, relevant ISA flags, and its marketing name (for people)."""

    vendor: str
    family: str
    model: str
    flags: tuple[str, ...]
    name: str

    def key(self) -> dict:
        """What a latency profile is keyed on (the marketing name is left out)."""
        d = asdict(self)
        d.pop("name")
        d["flags"] = list(self.flags)
        return d

    def label(self) -> str:
        """e.g. ``GenuineIntel family 6 model 143 [avx2 avx512f avx512_bf16 amx_bf16 amx_tile]``."""
        return f"{self.vendor} family {self.family} model {self.model} [{' '.join(self.flags) or 'no AVX'}]"


def parse_cpuinfo(text: str) -> CpuIdentity:
    """The identity of the first processor described in /proc/cpuinfo's ``text``."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return CpuIdentity(
        vendor=fields.get("vendor_id", "unknown"),
        family=fields.get("cpu family", "unknown"),
        model=fields.get("model", "unknown"),
        flags=tuple(f for f in RELEVANT_FLAGS if f in flags),
        name=fields.get("model name", "unknown"),
    )


def cpu_identity() -> CpuIdentity:
    """This machine's CPU (from /proc/cpuinfo; elsewhere, what ``platform`` knows)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        name = platform.processor() or platform.machine()
        return CpuIdentity(platform.system(), "unknown", name, (), name)
