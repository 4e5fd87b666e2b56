"""Two builds of our C++ kernels timed side by side in one process: a git revision's (default HEAD) and the
working tree's, on `benchmarks/model_forward.py`'s models and shapes.

This machine's memory rate moves between states within minutes (docs/results.md: 46-52 GB/s in one, 77-78 in
the other), so a kernel change timed in one process and then the other often lands inside that swing, or
shows one state's answer as the change's. Here both builds are loaded at once, each under its own operator
namespace, and repetitions alternate (A B, B A, A B, ...): each pair meets the same moment, and the median of
the per-repetition ratios is the number to quote, beside its medians over the repetitions where A ran faster
and slower than its median (a change can win in one memory state and lose in the other). `--baseline` equal
to the working tree gives the harness's own spread (an A/A run).

Only the C++ differs: both builds run the tree's Python, weights packed once by it (a change to a packed
layout needs two processes), and the int8-path and dequantized-tile thresholds of the tree's build for both
(a build from before `set_quant_dequant_rows` keeps its own dequantized-tile ones).

    python -m benchmarks.kernel_ab --model 1b --precision Q4_K_M --cases decode1,prefill16
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from benchmarks.cpu_load import busy_seconds, foreign_load, own_seconds
from benchmarks.forward_cases import PRECISIONS, gguf_file, ours_decode, ours_mixed, ours_prefill
from benchmarks.record import save_result

ROOT = Path(__file__).resolve().parent.parent
CSRC = "sarathi/model/csrc"
MAX_FOREIGN_LOAD = 0.08


def sources_at(revision: str) -> dict[str, bytes]:
    """The kernel sources (csrc's .cpp and .h files) at a git revision."""
    names = subprocess.check_output(
        ["git", "ls-tree", "--name-only", f"{revision}:{CSRC}"], cwd=ROOT, text=True
    ).split()
    return {
        name: subprocess.check_output(["git", "show", f"{revision}:{CSRC}/{name}"], cwd=ROOT)
        for name in names
        if name.endswith((".cpp", ".h"))
    }


def sources_in_tree() -> dict[str, bytes]:
    """The kernel sources as they are in the working tree."""
    return {p.name: p.read_bytes() for p in sorted((ROOT / CSRC).iterdir()) if p.suffix in (".cpp", ".h")}


def renamed(sources: dict[str, bytes], namespace: str) -> dict[str, bytes]:
    """The sources with every `sarathi_kernels` (their operators' namespace, and the C++ one) renamed
    `namespace`: two builds' C++ symbols then differ too."""
    word = re.compile(rb"\bsarathi_kernels\b")
    return {name: word.sub(namespace.encode(), text) for name, text in sources.items()}


def build(sources: dict[str, bytes], role: str) -> str:
    """Compile `sources` (cached by their content) and load them: the operator namespace they register."""
    from torch.utils.cpp_extension import load

    from sarathi.model import kernels
    from sarathi.model.embedded import cache_root

    digest = hashlib.sha256(torch.__version__.encode() + " ".join(kernels._FLAGS).encode())
    for name in sorted(sources):
        digest.update(name.encode() + sources[name])
    namespace = f"sarathi_ab_{role}_{digest.hexdigest()[:12]}"
    folder = cache_root() / "kernels-ab" / namespace
    (folder / "src").mkdir(parents=True, exist_ok=True)
    for name, text in renamed(sources, namespace).items():
        path = folder / "src" / name
        if not path.exists() or path.read_bytes() != text:
            path.write_bytes(text)
    load(
        name=namespace,
        sources=[str(p) for p in sorted((folder / "src").glob("*.cpp"))],
        extra_cflags=kernels._FLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        is_python_module=False,
        verbose=False,
    )
    ops = getattr(torch.ops, namespace)
    for bits in (4, 5, 6, 8):  # the same path choice for both builds: the tree's thresholds
        ops.set_quant_int8_rows(bits, kernels.quant_int8_rows(bits))
    if hasattr(ops, "set_quant_dequant_rows"):  # a build from before the setter keeps its own
        for offsets in (False, True):
            ops.set_quant_dequant_rows(offsets, kernels.quant_dequant_rows(offsets))
    return namespace


@contextlib.contextmanager
def serving(namespace: str) -> Iterator[None]:
    """sarathi.model.kernels calls `namespace`'s operators inside the block: it looks each one up on
    torch.ops.sarathi_kernels at call time, so the attribute is swapped for the other namespace."""
    from sarathi.model import decode_run

    ours, ours_layers = torch.ops.sarathi_kernels, decode_run.decode_layers
    ops = getattr(torch.ops, namespace)
    torch.ops.__dict__["sarathi_kernels"] = ops
    if _takes_weight_lists(ops):
        decode_run.decode_layers = functools.partial(_decode_layers_from_lists, ops)
    try:
        yield
    finally:
        torch.ops.__dict__["sarathi_kernels"] = ours
        decode_run.decode_layers = ours_layers


def _takes_weight_lists(ops) -> bool:
    """Whether a build's decode_layers takes a run's weights as lists (builds before decode_run_make)."""
    return hasattr(ops, "decode_layers") and not hasattr(ops, "decode_run_make")


def _decode_layers_from_lists(ops, h, run, cos, sin, ks, vs, slots, tables, lens, window, rows=None):
    """decode_run.decode_layers for such a build (a baseline from before decode_run_make): the layers through
    its list signature, then the final norm and LM head (where the run holds them) through its own kernels."""
    f = run.first
    ops.decode_layers(
        *(h, run.norms, run.tensors, run.segments, run.layout, cos, sin, ks, vs, slots, tables),
        *(lens, f.heads, f.head_dim, run.scale, window, f.eps, f.gelu, f.qk_norm, f.sandwich, f.f32),
    )
    if rows is None:
        return None
    head = run.head
    x = ops.rms_norm_f32(h, head.norm, head.eps, rows, head.bf16)
    logits = torch.empty(x.shape[0], head.width, dtype=torch.float32)
    for i in range(0, len(head.segments), 6):
        _, row, n, bits, sub, zero = head.segments[i : i + 6]
        codes, d, sc, dm, mc = head.tensors[i // 6 * 5 : i // 6 * 5 + 5]
        ops.quant_gemm(x, codes, d, sc, dm, mc, bits, sub, zero, logits[:, row : row + n], -1)
    return logits


def case_fn(case: str, model, arch, dtype) -> Callable[[], object]:
    """decodeB (B sequences of 512 cached tokens), prefillT (T tokens) or mixed (model_forward's shapes)."""
    if case.startswith("decode"):
        return ours_decode(model, arch, dtype, int(case.removeprefix("decode")))
    if case.startswith("prefill"):
        return ours_prefill(model, arch, dtype, int(case.removeprefix("prefill")))
    if case == "mixed":
        return ours_mixed(model, arch, dtype)
    raise ValueError(f"unknown case {case!r}: decodeB, prefillT or mixed")


def one_rep(fn: Callable[[], object], calls: int) -> float:
    """Median seconds per call over `calls` calls; retried (up to 5 times) while other processes used more
    than 8% of the machine. The median rather than forward_timing.timed_reps' mean: an A/A run with the mean
    had a repetition at 0.77x (prefill 16), the median 0.98-1.07x."""
    ncpu = os.cpu_count() or 1
    for _attempt in range(5):
        per_call = []
        busy0, own0, t0 = busy_seconds(), own_seconds(), time.perf_counter()
        for _ in range(calls):
            c0 = time.perf_counter()
            fn()
            per_call.append(time.perf_counter() - c0)
        wall = time.perf_counter() - t0
        if foreign_load(busy_seconds() - busy0, own_seconds() - own0, 0.0, wall, ncpu) <= MAX_FOREIGN_LOAD:
            break
    return statistics.median(per_call)


def alternate(
    fn: Callable[[], object], namespaces: list[str], reps: int, calls: int
) -> dict[str, list[float]]:
    """Seconds per call of each namespace, rep by rep, the order reversed every other rep."""
    times: dict[str, list[float]] = {ns: [] for ns in namespaces}
    with torch.inference_mode():
        for rep in range(reps):
            for ns in namespaces if rep % 2 == 0 else namespaces[::-1]:
                with serving(ns):
                    for _ in range(2):
                        fn()
                    times[ns].append(one_rep(fn, calls))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision whose kernels are A (default HEAD)")
    parser.add_argument("--model", default="1b", choices=["smollm2", "1b", "3b", "gemma3-270m"])
    parser.add_argument(
        "--precision", default="Q4_K_M", help="bf16-math or a quantized file (default Q4_K_M)"
    )
    parser.add_argument("--cases", default="decode1", help="comma-separated: decodeB, prefillT, mixed")
    parser.add_argument("--reps", type=int, default=12, help="repetitions per build (default 12)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per repetition (default 0.5)")
    args = parser.parse_args()

    from sarathi.model import kernels, load_model
    from sarathi.model.loader import resolve_compute_dtype

    if not kernels.portable_available():  # the AVX2 builds count (SARATHI_KERNELS=avx2 times that path)
        raise SystemExit(f"our kernels do not run here: {kernels.status()}")
    tree = sources_in_tree()
    base = sources_at(args.baseline)
    namespaces = [build(base, "a"), build(tree, "b")]
    same = "the same sources" if base == tree else "changed"
    print(f"A: {args.baseline}'s kernels, B: the working tree's ({same})")
    dtype = PRECISIONS["bf16-math"][0]
    quantized = args.precision != "bf16-math"
    model, arch, _ = load_model(
        str(gguf_file(args.precision, args.model)),
        dtype=dtype,
        compute_dtype=resolve_compute_dtype(dtype, "auto"),
        quantization="gguf" if quantized else "none",
    )
    rows = []
    for case in args.cases.split(","):
        fn = case_fn(case, model, arch, dtype)
        fn()
        t0 = time.perf_counter()
        fn()
        calls = max(3, int(args.seconds / max(time.perf_counter() - t0, 1e-4)))
        times = alternate(fn, namespaces, args.reps, calls)
        ratios = [b / a for a, b in zip(times[namespaces[0]], times[namespaces[1]], strict=True)]
        # the repetitions in A's faster and slower halves: where a change trades one memory state for another
        a_median = statistics.median(times[namespaces[0]])
        fast = [r for r, a in zip(ratios, times[namespaces[0]], strict=True) if a <= a_median]
        slow = [r for r, a in zip(ratios, times[namespaces[0]], strict=True) if a > a_median] or fast
        row = {
            "case": case,
            "a_ms": statistics.median(times[namespaces[0]]) * 1e3,
            "b_ms": statistics.median(times[namespaces[1]]) * 1e3,
            "b_over_a": statistics.median(ratios),
            "b_over_a_min": min(ratios),
            "b_over_a_max": max(ratios),
            "b_over_a_when_a_faster": statistics.median(fast),
            "b_over_a_when_a_slower": statistics.median(slow),
        }
        rows.append(row)
        print(
            f"{case:10s} A {row['a_ms']:8.2f} ms  B {row['b_ms']:8.2f} ms  B/A per rep: median "
            f"{row['b_over_a']:.3f} (min {row['b_over_a_min']:.3f}, max {row['b_over_a_max']:.3f}, "
            f"{args.reps} reps); where A ran faster {row['b_over_a_when_a_faster']:.3f}, slower "
            f"{row['b_over_a_when_a_slower']:.3f}"
        )
    settings = vars(args) | {"a": namespaces[0], "b": namespaces[1], "same_sources": same}
    print(f"saved {save_result('kernel_ab', rows, settings)}")


if __name__ == "__main__":
    main()
