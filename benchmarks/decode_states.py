"""One-sequence decode against its bytes' floor in each of the machine's memory states.

Some machines' memory rate switches between states within seconds or minutes (docs/results.md: a Zen5 read
at 44-53 GB/s in one and 71-79 in the other). A benchmark that times a case a few times lands in one state, or
straddles both. This one samples for a while: the read probe (`forward_timing.read_rate`), then five decode
steps of one sequence at 512 cached tokens, over and over; each sample's ratio is its median step over the
floor at that probe (model_forward's floor: the linear layers' bytes and the K/V read, at the probed rate).
It prints the median ratio and step of the samples in each state (split at `--split` GB/s).

    python -m benchmarks.decode_states --model 1b --precision Q4_K_M --seconds 240
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.forward_cases import MORE_QUANTIZED, QUANTIZED, ours_decode, quantized_file
from benchmarks.forward_timing import case_floor, read_rate
from benchmarks.record import save_result
from sarathi.model.linear import Linear
from sarathi.model.loader import load_model


def by_state(samples: list[dict], split: float) -> list[dict]:
    """Per state seen (read below `split` GB/s: slower, else faster), its sample count and the medians of the
    samples' read rate, step time and ratio to the floor."""
    rows = []
    for state, keep in (("slower", lambda r: r < split), ("faster", lambda r: r >= split)):
        mine = [s for s in samples if keep(s["read_gb_per_s"])]
        if mine:
            rows.append(
                {
                    "state": state,
                    "samples": len(mine),
                    **{
                        k: statistics.median(s[k] for s in mine)
                        for k in ("read_gb_per_s", "step_ms", "x_floor")
                    },
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="1b", choices=["smollm2", "1b", "3b"])
    parser.add_argument("--precision", default="Q4_K_M", choices=[*QUANTIZED, *MORE_QUANTIZED])
    parser.add_argument("--seconds", type=float, default=240.0, help="how long to sample (default 240)")
    parser.add_argument("--split", type=float, default=62.0, help="GB/s between the two states (default 62)")
    args = parser.parse_args()
    path = quantized_file(args.precision, args.model)
    model, arch, _ = load_model(path, dtype=torch.bfloat16, compute_dtype=torch.bfloat16, quantization="gguf")
    linear_bytes = sum(m.weight_bytes for m in model.modules() if isinstance(m, Linear))
    # the bytes floor only (a compute rate no step approaches at one sequence)
    rates = {"read_bytes_per_s": 1.0, "bfloat16_flops": float("inf"), "float32_flops": float("inf")}
    floor_bytes = case_floor(arch, torch.bfloat16, torch.bfloat16, "decode B=1", 1, rates, linear_bytes).bytes
    step = ours_decode(model, arch, torch.bfloat16, 1)
    for _ in range(3):
        step()
    samples = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        read = read_rate()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
        samples.append(
            {"read_gb_per_s": read / 1e9, "step_ms": ms, "x_floor": ms / (floor_bytes / read * 1e3)}
        )
    rows = by_state(samples, args.split)
    for row in rows:
        print(
            f"{row['state']} state: {row['samples']} samples, read {row['read_gb_per_s']:.1f} GB/s, step "
            f"{row['step_ms']:.2f} ms, {row['x_floor']:.3f}x the floor (medians)"
        )
    if len(rows) < 2:
        print(f"only one state seen (split at {args.split:g} GB/s)")
    settings = {
        "model": args.model,
        "precision": args.precision,
        "seconds": args.seconds,
        "split": args.split,
    }
    sample_rows = [{"state": "sample", **s} for s in samples]
    print(f"saved {save_result('decode_states', rows + sample_rows, settings)}")


if __name__ == "__main__":
    main()
