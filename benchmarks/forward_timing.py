"""Timing and floors of `benchmarks/model_forward.py`'s cases: guarded repetitions (repeated while other
processes load this shared machine), the read bandwidth and matmul rates measured now, and what bounds each
case from below (its bytes at the measured read rate, its FLOPs at the measured matmul rate)."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.cpu_load import busy_seconds, foreign_load, own_seconds
from benchmarks.forward_cases import CONTEXT, MIXED_CHUNK, MIXED_CHUNK_START, MIXED_DECODES
from sarathi.model import huge_pages

MAX_FOREIGN_LOAD = 0.08
MIN_REP_SECONDS = 0.2


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(median seconds per call, worst foreign load of the accepted repetitions) over `reps` guarded reps."""
    per_call, worst = timed_reps(fn, reps)
    return statistics.median(per_call), worst


def timed_reps(
    fn: Callable[[], object], reps: int, before_each: Callable[[], object] | None = None
) -> tuple[list[float], float]:
    """(seconds per call of each of `reps` guarded reps, worst foreign load of the accepted ones);
    `before_each` runs before each rep, untimed, and one untimed call after it: on a 2-core Xeon VM the first
    1B decode step after `read_rate` (512 MiB allocated, summed and freed) took 133-164 ms, the next 70-76 ms,
    as every step after the first of a serving engine's back-to-back iterations and of llama.cpp's runs."""
    fn()  # warm-up: oneDNN builds its kernels for a new shape on first use
    calls = max(1, int(MIN_REP_SECONDS / max(_once(fn), 1e-4)))
    per_call, worst = [], 0.0
    ncpu = os.cpu_count() or 1
    for _ in range(reps):
        if before_each is not None:
            before_each()
            fn()
        for _attempt in range(5):
            busy0, own0, t0 = busy_seconds(), own_seconds(), time.perf_counter()
            for _ in range(calls):
                fn()
            wall = time.perf_counter() - t0
            foreign = foreign_load(busy_seconds() - busy0, own_seconds() - own0, 0.0, wall, ncpu)
            if foreign <= MAX_FOREIGN_LOAD:
                break
        per_call.append(wall / calls)
        worst = max(worst, foreign)
    return per_call, worst


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_rate() -> float:
    """Read bandwidth now (bytes/s): the faster of summing a 512 MiB fp32 or bf16 tensor on huge pages."""
    best = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        x = huge_pages.empty((512 * 2**20 // torch.empty((), dtype=dtype).element_size(),), dtype).fill_(1)
        seconds, _ = timed(lambda x=x: x.sum(), 3)
        best = max(best, x.numel() * x.element_size() / seconds)
        del x
    return best


def machine_rates() -> dict[str, float]:
    """Read bandwidth (bytes/s) and matmul rates (FLOP/s) in fp32 and bf16, measured now."""
    from sarathi.model import kernels

    rates = {"read_bytes_per_s": read_rate()}
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    fp32 = 2 * n**3 / timed(lambda: a @ b, 3)[0]
    if torch.backends.mkldnn.is_available():  # the pre-packed oneDNN GEMM our fp32 layers use
        packed32 = torch.ops.mkldnn._reorder_linear_weight(b)
        linear = torch.ops.mkldnn._linear_pointwise
        fp32 = max(fp32, 2 * n**3 / timed(lambda: linear(a, packed32, None, "none", [], ""), 3)[0])
    rates["float32_flops"] = fp32
    if kernels.available():
        a16, b16 = a.bfloat16(), b.bfloat16()
        bf16 = 2 * n**3 / timed(lambda: a16 @ b16, 3)[0]
        packed = kernels.pack(b16)
        bf16 = max(bf16, 2 * n**3 / timed(lambda: kernels.gemm(a16, packed, n, None), 3)[0])
    else:  # without AVX512-BF16, PyTorch emulates bf16 matmuls (minutes at n = 2048): measure a smaller one
        a16, b16 = a[:256, :256].bfloat16(), b[:256, :256].bfloat16()
        bf16 = 2 * 256**3 / timed(lambda: a16 @ b16, 3)[0]
    rates["bfloat16_flops"] = bf16
    return rates


@dataclasses.dataclass
class Floor:
    """What bounds one case from below: the bytes it reads and the seconds its FLOPs take at the measured
    matmul rate; `reads` are the read bandwidths (bytes/s) measured right before each repetition."""

    bytes: int
    compute_seconds: float
    reads: list[float] = dataclasses.field(default_factory=list)

    def seconds_at(self, read_bytes_per_s: float) -> float:
        return max(self.bytes / read_bytes_per_s, self.compute_seconds)

    def read_rate(self) -> float:
        return statistics.median(self.reads)

    def seconds(self) -> float:
        """The floor at the median read bandwidth measured beside the case."""
        return self.seconds_at(self.read_rate())

    def ratio(self, rep_seconds: list[float]) -> float:
        """Median over repetitions of (its time / the floor at the bandwidth measured just before it)."""
        return statistics.median(t / self.seconds_at(r) for t, r in zip(rep_seconds, self.reads, strict=True))

    def timed(self, fn: Callable[[], object], reps: int) -> tuple[list[float], float]:
        """timed_reps(fn, reps), measuring the read bandwidth before each repetition."""
        return timed_reps(fn, reps, before_each=lambda: self.reads.append(read_rate()))


def case_floor(
    arch, dtype, compute, case: str, tokens: int, rates: dict[str, float], linear_bytes: int | None = None
) -> Floor:
    """The bytes floor and the compute floor of one case (see the module docstring), the read bandwidths
    still to be measured; `linear_bytes` replaces the linear layers' weight bytes (a quantized model's)."""
    h, hd, layers = arch.hidden_size, arch.head_dim, arch.num_hidden_layers
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    per_layer = h * (heads + 2 * kv_heads) * hd + heads * hd * h + 3 * h * arch.intermediate_size
    elsize = torch.empty((), dtype=dtype).element_size()
    decodes, chunk, chunk_start = tokens, 0, 0  # decode case
    if case.startswith("prefill"):
        decodes, chunk = 0, tokens
    elif case.startswith("mixed"):
        decodes, chunk, chunk_start = MIXED_DECODES, MIXED_CHUNK, MIXED_CHUNK_START
    logit_rows = decodes + (1 if chunk else 0)
    weight_bytes = (layers * per_layer + h * arch.vocab_size) * elsize
    if linear_bytes is not None:
        weight_bytes = linear_bytes
    kv_bytes = (decodes * CONTEXT + (chunk_start if chunk else 0)) * layers * kv_heads * hd * 2 * elsize
    flops = 2 * layers * per_layer * tokens + 2 * h * arch.vocab_size * logit_rows
    # q.k and p.v: 4 FLOPs per (query, key, head dim); a chunk's queries see the cached keys and half its own
    keys_seen = decodes * CONTEXT + chunk * (chunk_start + chunk / 2)
    flops += 4 * keys_seen * heads * hd * layers
    rate = rates["bfloat16_flops" if compute == torch.bfloat16 else "float32_flops"]
    return Floor(weight_bytes + kv_bytes, flops / rate)
