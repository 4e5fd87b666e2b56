"""Suite-wide settings.

``--token-budget auto`` (the default of ``serve`` and ``bench``) needs this machine's latency profile, which
takes minutes to measure on a machine that has none, as a fresh CI machine has not. Tests that build
engines pass explicit budgets; should one reach ``auto`` anyway, it reads a kept profile instead of
profiling (a run can point ``SARATHI_LATENCY_PROFILE`` elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path

KEPT_PROFILES = Path(__file__).parent / "data" / "latency-profiles"
FALLBACK_PROFILE = KEPT_PROFILES / "amd-epyc-zen4-family25-model17-bf16.json"
os.environ.setdefault("SARATHI_LATENCY_PROFILE", str(FALLBACK_PROFILE))
