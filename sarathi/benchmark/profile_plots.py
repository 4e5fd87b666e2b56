"""Plots of ``sarathi profile`` results (PNG, drawn off-screen with the Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sarathi.benchmark.profiler import ProfileResult


def plot_profile(results: Sequence[ProfileResult], path: str | Path) -> Path:
    """Three panels: (a) iteration time vs tokens in the batch, (b) decode time per token vs decode batch
    size, (c) per-token cost of prefill vs decode. One line per context length."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(18, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_a, ax_b, ax_c = fig.subplots(1, 3)
    contexts = sorted({r.context_len for r in results})
    colors = {c: f"C{i % 10}" for i, c in enumerate(contexts)}

    def series(kind: str, context: int) -> list[ProfileResult]:
        return sorted(
            (r for r in results if r.kind == kind and r.context_len == context), key=lambda r: r.num_tokens
        )

    for c in contexts:
        prefill, decode = series("prefill", c), series("decode", c)
        mixed = [r for r in results if r.kind == "mixed" and r.context_len == c]
        style = {"color": colors[c]}
        if prefill:
            tokens = [r.num_tokens for r in prefill]
            ax_a.plot(tokens, [r.median_ms for r in prefill], "o-", label=f"prefill, ctx {c}", **style)
            ax_c.plot(tokens, [r.ms_per_token for r in prefill], "o-", label=f"prefill, ctx {c}", **style)
        if decode:
            tokens = [r.num_tokens for r in decode]
            ax_a.plot(tokens, [r.median_ms for r in decode], "s--", label=f"decode, ctx {c}", **style)
            ax_c.plot(tokens, [r.ms_per_token for r in decode], "s--", label=f"decode, ctx {c}", **style)
            spread = [
                [(r.median_ms - r.p10_ms) / r.num_tokens for r in decode],
                [(r.p90_ms - r.median_ms) / r.num_tokens for r in decode],
            ]
            ax_b.errorbar(
                tokens,
                [r.ms_per_token for r in decode],
                yerr=spread,
                fmt="s-",
                capsize=3,
                label=f"ctx {c}",
                **style,
            )
        if mixed:
            ax_a.scatter(
                [r.num_tokens for r in mixed],
                [r.median_ms for r in mixed],
                marker="x",
                alpha=0.6,
                label=f"mixed, ctx {c}",
                **style,
            )

    ax_a.set(
        title="(a) iteration time vs tokens in the batch",
        xlabel="tokens in the batch",
        ylabel="median iteration time (ms)",
    )
    ax_b.set(
        title="(b) decode: time per token vs batch size",
        xlabel="decode batch size",
        ylabel="ms per decode token (p10-p90 bars)",
    )
    ax_c.set(
        title="(c) per-token cost: prefill vs decode", xlabel="tokens in the batch", ylabel="ms per token"
    )
    for ax in (ax_a, ax_b, ax_c):
        ax.set_xscale("symlog", base=2, linthresh=1)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in (ax_b, ax_c):
        ax.set_yscale("log")
    fig.savefig(path, dpi=110)
    return path
