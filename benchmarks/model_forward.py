"""Forward-pass times of the embedded SmolLM2-135M (or, with --model 1b / 3b, random weights at Llama 3.2's
1B / 3B shapes, benchmarks/random_gguf.py; with --model gemma3-270m, the packaged Gemma 3 270M Q4_K_M file):
our paged model vs Hugging Face transformers (eager).

Prefill: one sequence of T tokens from position 0 (logits of the last token only).
Decode: B sequences, one new token each, every sequence with CONTEXT tokens already cached.
Precisions: float32; bfloat16 (bf16 weights and KV cache, fp32 math); bf16-math (--compute-dtype bfloat16);
and GGUF quantizations served in their own blocks (--quantization gguf; bf16 KV cache, bf16 activations where
the AVX512-BF16 kernels run, else float32 ones around the quantized kernels' AVX2 path): Q4_1
(the file as shipped), Q8_0 and Q4_K_M (requantized from it by llama.cpp's llama-quantize, which needs
--llama-cpp's build). Pick with --precisions (default: float32,bfloat16,bf16-math,Q4_1).
HF decode uses a DynamicCache pre-filled with random K/V of the same length, cropped back after each step.

Floors, measured in the same run: bytes floor = bytes read (weights, plus K/V for decodes) / measured read
bandwidth (the faster of summing a 512 MiB fp32 or bf16 tensor, on huge pages as our weights are: on 4 KiB
pages the sum read 1-8% slower, a floor that much too lenient); compute floor = FLOPs / measured matmul rate
in the compute dtype (a 2048^3 GEMM; bf16 through our kernel where it runs); a case's floor is the larger.
The read bandwidth is measured again right before each repetition of a case, and the ratio to the floor is the
median over repetitions of (its time / the floor at the bandwidth measured just before it); the floor printed
is at the median of those bandwidths. This shared machine's memory rate moves by tens of percent within
minutes (45 to 72 GB/s on a Zen5): against one measurement at the start, the same code's ratio went from
1.0x to 1.6x between runs.

Each number is the median of REPS repetitions; a repetition is repeated (up to 5 tries) when other processes
used more than 8% of the machine during it (this machine's cores are shared), and the worst foreign load
accepted is printed. With --llama-cpp, llama.cpp's own benchmarks (llama-bench, llama-batched-bench; see
benchmarks/llama_cpp_kernels.py) time the same prefill and decode shapes on the BF16 GGUF of the same
weights in the same run, beside bf16-math, and on each quantized file beside ours on that same file. Ours
is timed again right after llama.cpp and its median taken over both halves, so that a drift of this shared
machine's memory bandwidth (it moves by tens of percent over minutes) weighs on both engines alike.
Run: .venv/bin/python -m benchmarks.model_forward [--quick] [--no-hf] [--llama-cpp] [--precisions ...]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from benchmarks.forward_cases import (
    BLOCK_SIZE,
    CONTEXT,
    DECODE_BATCHES,
    DEFAULT_PRECISIONS,
    GEMMA,
    MIXED_CHUNK,
    MIXED_DECODES,
    MORE_QUANTIZED,
    PRECISIONS,
    PREFILL_TOKENS,
    QUANTIZED,
    gguf_file,
    hf_decode,
    hf_prefill,
    ours_decode,
    ours_mixed,
    ours_prefill,
    quantized_file,
)
from benchmarks.forward_timing import MAX_FOREIGN_LOAD, Floor, case_floor, machine_rates, timed
from benchmarks.record import save_result
from sarathi.model import embedded_model_path, load_model
from sarathi.model.linear import Linear
from sarathi.model.loader import resolve_compute_dtype


def compare_llama_cpp(
    rows: list[dict],
    reps: int,
    name: str,
    model: str,
    ours_fns: dict[str, Callable[[], object]],
    ours_reps: dict[str, list[float]],
    floors: dict[str, Floor],
    prefill_tokens: tuple[int, ...] = PREFILL_TOKENS,
    decode_batches: tuple[int, ...] = DECODE_BATCHES,
) -> dict:
    """Time llama.cpp at our prefill and decode shapes on precision `name`'s GGUF file, then ours again
    (`ours_fns`, whose first reps are `ours_reps`; `floors` see the read bandwidth beside that timing too):
    add its ms, ours over both halves, and ours / its, to that precision's rows; returns what was run, for
    the record."""
    from benchmarks.llama_cpp_build import binary, build_info, ensure_llama_cpp, llama_cpp_version
    from benchmarks.llama_cpp_kernels import decode_times, prefill_times

    ensure_llama_cpp()
    gguf = gguf_file(name, model)
    threads = torch.get_num_threads()
    times = prefill_times(binary("llama-bench"), gguf, list(prefill_tokens), threads, reps, MAX_FOREIGN_LOAD)
    times += decode_times(
        binary("llama-batched-bench"), gguf, list(decode_batches), CONTEXT, threads, reps, MAX_FOREIGN_LOAD
    )
    ours = {r["case"]: r for r in rows if r["dtype"] == name}
    print(f"llama.cpp ({llama_cpp_version()}, {gguf.name}, -t {threads}) vs ours ({name}, timed again):")
    for t in times:
        row, floor = ours[t.case], floors[t.case]
        after, after_load = floor.timed(ours_fns[t.case], reps)
        both = ours_reps[t.case] + after
        row |= {
            "ours_ms_before": statistics.median(ours_reps[t.case]) * 1e3,
            "ours_ms_after": statistics.median(after) * 1e3,
            "ours_ms": statistics.median(both) * 1e3,
            "ours_foreign_load": max(row["ours_foreign_load"], after_load),
        }
        row |= {"floor_ms": floor.seconds() * 1e3, "read_gb_per_s": floor.read_rate() / 1e9}
        row["x_floor"] = floor.ratio(both)
        row |= {"llama_cpp_ms": t.ms, "llama_cpp_foreign_load": t.foreign_load}
        row["x_llama_cpp"] = row["ours_ms"] / t.ms
        print(
            f"  {t.case:14s} llama.cpp {t.ms:8.1f} ms [{t.foreign_load:.0%}]  ours {row['ours_ms']:8.1f} ms"
            f" (before {row['ours_ms_before']:.1f}, after {row['ours_ms_after']:.1f})"
            f"  ours/llama.cpp {row['x_llama_cpp']:4.2f}x  floor {row['floor_ms']:6.1f} ms"
            f" (ours {row['x_floor']:4.2f}x, llama.cpp {t.ms / row['floor_ms']:4.2f}x)"
        )
    return {
        "version": llama_cpp_version(),
        **build_info(),
        "weights": gguf.name,
        "threads": threads,
        "commands": {t.case: t.command for t in times},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    parser.add_argument(
        "--llama-cpp", action="store_true", help="also time llama.cpp (built once) at the same shapes"
    )
    parser.add_argument(
        "--precisions",
        default=DEFAULT_PRECISIONS,
        help=f"comma-separated, from {', '.join([*PRECISIONS, *QUANTIZED, *MORE_QUANTIZED])} "
        f"(default {DEFAULT_PRECISIONS})",
    )
    parser.add_argument(
        "--model",
        default="smollm2",
        choices=["smollm2", "1b", "3b", GEMMA],
        help="the embedded SmolLM2, random weights at Llama 3.2 1B / 3B shapes, or Gemma 3 270M's packaged "
        "Q4_K_M file (bf16-math and quantized precisions only; other files are made with llama-quantize)",
    )
    parser.add_argument(
        "--prefill",
        default=",".join(map(str, PREFILL_TOKENS)),
        help="comma-separated prefill lengths (default %(default)s)",
    )
    parser.add_argument(
        "--decode",
        default=",".join(map(str, DECODE_BATCHES)),
        help="comma-separated decode batch sizes (default %(default)s; llama.cpp prefills 512 tokens per "
        "sequence first, so 32 sequences at a 1B shape take tens of minutes on a slow CPU)",
    )
    args = parser.parse_args()
    prefill_tokens = tuple(int(t) for t in args.prefill.split(","))
    decode_batches = tuple(int(b) for b in args.decode.split(","))
    names = args.precisions.split(",")
    if args.model != "smollm2":
        args.no_hf = True
        if args.precisions == DEFAULT_PRECISIONS:
            names = ["bf16-math", "Q4_K_M", "Q8_0"] if args.model == GEMMA else ["bf16-math", *QUANTIZED]
        if {"float32", "bfloat16"} & set(names):
            parser.error(f"--model {args.model} runs bf16-math and the quantized precisions")
    unknown = [n for n in names if n not in PRECISIONS and n not in (*QUANTIZED, *MORE_QUANTIZED)]
    if unknown:
        parser.error(f"unknown precisions: {', '.join(unknown)}")
    reps = 3 if args.quick else 5
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, block_size {BLOCK_SIZE}, "
        f"decode context {CONTEXT}; ms per forward (median of {reps}), [worst foreign load]"
    )
    rates = machine_rates()
    print(
        f"measured: read {rates['read_bytes_per_s'] / 1e9:.1f} GB/s, matmul fp32 "
        f"{rates['float32_flops'] / 1e9:.0f} GFLOP/s, bf16 {rates['bfloat16_flops'] / 1e9:.0f} GFLOP/s"
    )
    rows: list[dict] = []
    llama_cpp: dict[str, dict] = {}
    for name in names:
        quantized = name in (*QUANTIZED, *MORE_QUANTIZED)
        dtype, compute = PRECISIONS["bf16-math" if quantized else name]
        if quantized:  # as served: bf16 math where the AVX512-BF16 kernels run, else float32 (AVX2 path)
            compute = resolve_compute_dtype(dtype, "auto")
        if quantized:  # served from the file's own blocks
            path = quantized_file(name, args.model)
            model, arch, _ = load_model(path, dtype=dtype, compute_dtype=compute, quantization="gguf")
        else:
            path = None if args.model == "smollm2" else str(gguf_file(name, args.model))
            model, arch, _ = load_model(path, dtype=dtype, compute_dtype=compute)
        linear_bytes = None
        if quantized:
            linear_bytes = sum(m.weight_bytes for m in model.modules() if isinstance(m, Linear))
            formats = ", ".join(model.quantized_layers())
            print(f"{name}: linear layers {linear_bytes / 1e6:.1f} MB ({formats})")
        hf = None
        if not args.no_hf and not quantized:  # transformers computing in our compute dtype
            from transformers import LlamaForCausalLM as HFLlama

            hf = HFLlama.from_pretrained(embedded_model_path(), attn_implementation="eager", dtype=compute)
            hf.eval()
        cases = [
            (f"prefill T={t}", ours_prefill(model, arch, dtype, t), hf and hf_prefill(hf, arch, t), t)
            for t in prefill_tokens
        ]
        cases += [
            (f"decode B={b}", ours_decode(model, arch, dtype, b), hf and hf_decode(hf, arch, compute, b), b)
            for b in decode_batches
        ]
        cases.append(
            (
                f"mixed {MIXED_CHUNK}+{MIXED_DECODES}d",
                ours_mixed(model, arch, dtype),
                None,
                MIXED_CHUNK + MIXED_DECODES,
            )
        )
        ours_fns = {label: ours_fn for label, ours_fn, _, _ in cases}
        ours_reps: dict[str, list[float]] = {}
        floors: dict[str, Floor] = {}
        for label, ours_fn, hf_fn, tokens in cases:
            floor = floors[label] = case_floor(arch, dtype, compute, label, tokens, rates, linear_bytes)
            ours_reps[label], ours_load = floor.timed(ours_fn, reps)
            ours_s, floor_s, x_floor = (
                statistics.median(ours_reps[label]),
                floor.seconds(),
                floor.ratio(ours_reps[label]),
            )
            row = {
                "dtype": name,
                "case": label,
                "ours_ms": ours_s * 1e3,
                "ours_foreign_load": ours_load,
                "floor_ms": floor_s * 1e3,
                "x_floor": x_floor,
                "read_gb_per_s": floor.read_rate() / 1e9,
            }
            line = (
                f"{name:10s} {label:14s} ours {ours_s * 1e3:8.1f} ms ({tokens / ours_s:7.0f} tok/s) "
                f"[{ours_load:.0%}]  floor {floor_s * 1e3:6.1f} ms ({x_floor:4.2f}x; "
                f"read {floor.read_rate() / 1e9:.1f} GB/s)"
            )
            if hf_fn is not None:
                hf_s, hf_load = timed(hf_fn, reps)
                line += f"   HF eager {hf_s * 1e3:8.1f} ms [{hf_load:.0%}]   speedup {hf_s / ours_s:4.2f}x"
                row |= {"hf_eager_ms": hf_s * 1e3, "hf_foreign_load": hf_load}
            rows.append(row)
            print(line, flush=True)
        if args.llama_cpp and (name == "bf16-math" or quantized):  # while our model is loaded
            llama_cpp[name] = compare_llama_cpp(
                rows, reps, name, args.model, ours_fns, ours_reps, floors, prefill_tokens, decode_batches
            )
        del model, hf
    settings = {
        "model": args.model,
        "reps": reps,
        "block_size": BLOCK_SIZE,
        "decode_context": CONTEXT,
        "prefill_tokens": list(prefill_tokens),
        "decode_batches": list(decode_batches),
    }
    settings["rates"] = rates
    if llama_cpp:
        settings["llama_cpp"] = llama_cpp
    print(f"saved {save_result('model_forward', rows, settings)}")


if __name__ == "__main__":
    main()
