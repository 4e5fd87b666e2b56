"""Log-probability error of sarathi and of llama.cpp on the same GGUF file, against transformers fp32.

Both engines serve the embedded SmolLM2's shipped file (Q4_1, Q8_0 LM head) in its own blocks: sarathi with
``quantization="gguf"`` (its default bf16 math), llama.cpp's ``llama-server -t 2``. Each decodes a few
prompts greedily and returns the top log probabilities at every generated position; the reference is
transformers fp32 on the same weights dequantized, run over each engine's own tokens (so a near-tie that
sends one engine another way is still compared at the positions it produced). Reported per engine: the
largest and the median absolute error of the returned log probabilities (nats), over every position and
every returned alternative. llama.cpp returns log probabilities, not logits, so this is the comparison its
server allows. Saves the rows with the machine and the commit:

    python -m benchmarks.logprob_error [--tokens 16] [--top 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from benchmarks.llama_cpp_build import binary, ensure_llama_cpp
from benchmarks.record import save_result
from sarathi.net import free_port

HOST = "127.0.0.1"

PROMPTS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris. It is named after",
    "Write a haiku about the sea.",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Q: What is the capital of Japan?\nA:",
    "Once upon a time, in a small village by the mountains,",
]


def llama_cpp_logprobs(gguf: Path, prompts: list[list[int]], tokens: int, top: int) -> list[list[tuple]]:
    """Per prompt, per generated position: (chosen id, [(id, logprob), ...]) from llama-server."""
    ensure_llama_cpp()
    port = free_port()
    cmd = [str(binary("llama-server")), "-m", str(gguf), "--host", HOST, "--port", str(port), "-t", "2"]
    cmd += ["-c", "4096", "-np", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("llama-server did not start")
            time.sleep(0.5)
        results = []
        with httpx.Client(timeout=120) as client:
            for ids in prompts:
                body = {
                    "prompt": ids,
                    "n_predict": tokens,
                    "temperature": 0,
                    "n_probs": top,
                    "cache_prompt": False,
                    "post_sampling_probs": False,
                }
                reply = client.post(f"{url}/completion", json=body).json()
                steps = []
                for p in reply["completion_probabilities"]:
                    alternatives = [(a["id"], a["logprob"]) for a in p["top_logprobs"]]
                    steps.append((p["id"], alternatives))
                results.append(steps)
        return results
    finally:
        proc.terminate()
        proc.wait(30)


def sarathi_logprobs(prompts: list[list[int]], tokens: int, top: int) -> list[list[tuple]]:
    from sarathi import LLM, SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=top, ignore_eos=True)
    with LLM(quantization="gguf") as llm:
        outputs = llm.generate(prompts, params)
    return [[(lp.token_id, list(lp.top)) for lp in out.logprobs] for out in outputs]


def errors(model, prompt: list[int], steps: list[tuple]) -> list[float]:
    """|engine logprob - fp32 logprob| for every returned alternative at every generated position."""
    chosen = [token for token, _ in steps]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + chosen])).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)
    out = []
    for i, (_, alternatives) in enumerate(steps):
        row = ref[len(prompt) - 1 + i]
        out.extend(abs(lp - row[token].item()) for token, lp in alternatives)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt")
    p.add_argument("--top", type=int, default=10, help="log probabilities returned per position")
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sarathi.model.embedded import embedded_gguf_path, embedded_model_path

    folder = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    runs = {
        "sarathi (gguf, bf16 math)": sarathi_logprobs(prompts, args.tokens, args.top),
        "llama.cpp llama-server": llama_cpp_logprobs(embedded_gguf_path(), prompts, args.tokens, args.top),
    }
    rows = []
    for engine, per_prompt in runs.items():
        errs = [
            e
            for prompt, steps in zip(prompts, per_prompt, strict=True)
            for e in errors(reference, prompt, steps)
        ]
        row = {
            "engine": engine,
            "file": embedded_gguf_path().name,
            "positions": sum(len(steps) for steps in per_prompt),
            "values": len(errs),
            "max_abs_logprob_error": round(max(errs), 4),
            "median_abs_logprob_error": round(statistics.median(errs), 5),
        }
        rows.append(row)
        print(
            f"{engine:28s} {row['positions']} positions, {row['values']} log probabilities: "
            f"max error {row['max_abs_logprob_error']:.4f}, "
            f"median {row['median_abs_logprob_error']:.5f} nats",
            flush=True,
        )
    print(f"saved {save_result('logprob_error', rows, vars(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
