"""Plot a `benchmarks.model_forward --llama-cpp` record: ours / llama.cpp time per forward shape, one group of
bars per GGUF file (BF16 beside bf16-math, and each quantization served in its own blocks). Below 1 is faster
than llama.cpp on the same file.

    python -m benchmarks.plot_forward benchmarks/results/model_forward-....json docs/img/forward.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(record_path: Path, out: Path) -> None:
    """Write the bar chart of `record_path` to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(record_path.read_text())
    rows = [r for r in record["rows"] if "x_llama_cpp" in r]
    precisions = list(dict.fromkeys(r["dtype"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    width = 0.8 / len(precisions)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, name in enumerate(precisions):
        ratio = {r["case"]: r["x_llama_cpp"] for r in rows if r["dtype"] == name}
        xs = [c + (i - (len(precisions) - 1) / 2) * width for c in range(len(cases))]
        label = "BF16 (ours: bf16-math)" if name == "bf16-math" else name
        ax.bar(xs, [ratio.get(c, float("nan")) for c in cases], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cases)), cases)
    ax.set_ylabel("ours / llama.cpp time (lower is faster)")
    machine = record.get("machine", {}).get("cpu", "")
    model = record.get("settings", {}).get("model", "smollm2")
    title = f"{model}: forward pass vs llama.cpp on the same GGUF ({machine}, commit {record['commit']})"
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"wrote {sys.argv[2]}")
