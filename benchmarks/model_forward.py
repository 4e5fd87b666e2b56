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
import dataclasses
import os
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.cpu_load import busy_seconds, foreign_load, own_seconds
from benchmarks.record import save_result
from sarathi.model import (
    SeqSlice,
    allocate_kv_cache,
    build_attention_metadata,
    embedded_model_path,
    huge_pages,
    load_model,
)
from sarathi.model.linear import Linear
from sarathi.model.loader import resolve_compute_dtype

BLOCK_SIZE = 16
CONTEXT = 512
PREFILL_TOKENS = (16, 64, 256)
DECODE_BATCHES = (1, 8, 32)
MIXED_CHUNK, MIXED_CHUNK_START, MIXED_DECODES = 64, 256, 16
MAX_FOREIGN_LOAD = 0.08
MIN_REP_SECONDS = 0.2
# name -> (weights and KV cache, matmul arithmetic)
PRECISIONS = {
    "float32": (torch.float32, torch.float32),
    "bfloat16": (torch.bfloat16, torch.float32),
    "bf16-math": (torch.bfloat16, torch.bfloat16),
}
QUANTIZED = ("Q4_1", "Q8_0", "Q4_K_M")  # GGUF files of the embedded weights; Q4_1 is the one shipped
DEFAULT_PRECISIONS = "float32,bfloat16,bf16-math,Q4_1"
GEMMA = "gemma3-270m"


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(median seconds per call, worst foreign load of the accepted repetitions) over `reps` guarded reps."""
    per_call, worst = timed_reps(fn, reps)
    return statistics.median(per_call), worst


def timed_reps(
    fn: Callable[[], object], reps: int, before_each: Callable[[], object] | None = None
) -> tuple[list[float], float]:
    """(seconds per call of each of `reps` guarded reps, worst foreign load of the accepted ones);
    `before_each` runs before each rep, untimed."""
    fn()  # warm-up: oneDNN builds its kernels for a new shape on first use
    calls = max(1, int(MIN_REP_SECONDS / max(_once(fn), 1e-4)))
    per_call, worst = [], 0.0
    ncpu = os.cpu_count() or 1
    for _ in range(reps):
        if before_each is not None:
            before_each()
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


def ours_prefill(model, arch, dtype, tokens: int) -> Callable[[], object]:
    """One prefill chunk of `tokens` tokens from position 0."""
    blocks = -(-tokens // BLOCK_SIZE)
    kv = allocate_kv_cache(arch, blocks, BLOCK_SIZE, dtype)
    meta = build_attention_metadata([SeqSlice(list(range(blocks)), 0, tokens)], BLOCK_SIZE)
    ids = torch.randint(0, arch.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    last = torch.tensor([tokens - 1])
    return lambda: model(ids, meta.positions, meta, kv, last)


def ours_decode(model, arch, dtype, batch: int) -> Callable[[], object]:
    """One decode step for `batch` sequences of CONTEXT cached tokens (blocks shuffled across sequences)."""
    per_seq = -(-(CONTEXT + 1) // BLOCK_SIZE)
    kv = allocate_kv_cache(arch, batch * per_seq, BLOCK_SIZE, dtype)
    pool = torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(0)).tolist()
    slices = [SeqSlice(pool[i * per_seq : (i + 1) * per_seq], CONTEXT, 1) for i in range(batch)]
    meta = build_attention_metadata(slices, BLOCK_SIZE)
    ids = torch.randint(0, arch.vocab_size, (batch,), generator=torch.Generator().manual_seed(0))
    rows = torch.arange(batch)
    return lambda: model(ids, meta.positions, meta, kv, rows)


def ours_mixed(model, arch, dtype) -> Callable[[], object]:
    """One stall-free iteration: a MIXED_CHUNK-token prefill chunk (MIXED_CHUNK_START tokens of its prompt
    already cached) with MIXED_DECODES decodes of CONTEXT cached tokens."""
    per_seq = -(-(CONTEXT + 1) // BLOCK_SIZE)
    chunk_blocks = -(-(MIXED_CHUNK_START + MIXED_CHUNK) // BLOCK_SIZE)
    total = MIXED_DECODES * per_seq + chunk_blocks
    kv = allocate_kv_cache(arch, total, BLOCK_SIZE, dtype)
    pool = torch.randperm(total, generator=torch.Generator().manual_seed(0)).tolist()
    slices = [SeqSlice(pool[:chunk_blocks], MIXED_CHUNK_START, MIXED_CHUNK)]
    rest = pool[chunk_blocks:]
    slices += [SeqSlice(rest[i * per_seq : (i + 1) * per_seq], CONTEXT, 1) for i in range(MIXED_DECODES)]
    meta = build_attention_metadata(slices, BLOCK_SIZE)
    tokens = MIXED_CHUNK + MIXED_DECODES
    ids = torch.randint(0, arch.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    rows = torch.tensor([MIXED_CHUNK - 1, *range(MIXED_CHUNK, tokens)])
    return lambda: model(ids, meta.positions, meta, kv, rows)


def hf_prefill(hf, arch, tokens: int) -> Callable[[], object]:
    """HF forward of `tokens` tokens without a cache, logits of the last token only."""
    ids = torch.randint(0, arch.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))

    def run():
        with torch.no_grad():
            return hf(ids, use_cache=False, logits_to_keep=1).logits

    return run


def hf_decode(hf, arch, dtype, batch: int) -> Callable[[], object]:
    """HF decode step for `batch` sequences over a DynamicCache of CONTEXT random tokens."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    gen = torch.Generator().manual_seed(0)
    shape = (batch, arch.num_key_value_heads, CONTEXT, arch.head_dim)
    for layer in range(arch.num_hidden_layers):
        keys, values = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
        cache.update(keys, values, layer)
    ids = torch.randint(0, arch.vocab_size, (batch, 1), generator=gen)
    positions = torch.full((batch, 1), CONTEXT)

    def run():
        with torch.no_grad():
            out = hf(ids, past_key_values=cache, position_ids=positions, logits_to_keep=1).logits
        cache.crop(-1)  # drop the token just appended
        return out

    return run


def source_gguf(model: str):
    """The GGUF the files of a --model are made from: the embedded Q4_1 file, Gemma 3's Q4_K_M file, or
    the random F16 one."""
    from benchmarks.random_gguf import ensure_random_gguf
    from sarathi.model.embedded import PACKAGED_MODELS, embedded_gguf_path

    if model == GEMMA:
        return PACKAGED_MODELS[GEMMA].gguf_path()
    return embedded_gguf_path() if model == "smollm2" else ensure_random_gguf(model)


def gguf_file(name: str, model: str = "smollm2"):
    """The GGUF file a precision runs on with llama.cpp: BF16 for bf16-math, else the named quantization
    (the source file itself where it is that quantization)."""
    from benchmarks.llama_cpp_build import ensure_gguf

    if (model, name) == (GEMMA, "Q4_K_M"):
        return source_gguf(model)
    return ensure_gguf("BF16" if name == "bf16-math" else name, src=source_gguf(model))


def quantized_file(name: str, model: str) -> str | None:
    """The file a quantized precision is served from: None (the embedded model) for SmolLM2's shipped Q4_1."""
    return None if (name, model) == ("Q4_1", "smollm2") else str(gguf_file(name, model))


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
        help=f"comma-separated, from {', '.join([*PRECISIONS, *QUANTIZED])} (default {DEFAULT_PRECISIONS})",
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
    unknown = [n for n in names if n not in PRECISIONS and n not in QUANTIZED]
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
        quantized = name in QUANTIZED
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
