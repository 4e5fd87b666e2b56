"""PNG plots of benchmark runs (matplotlib, Agg backend): latency CDFs, token timelines with generation
stalls (paper Fig. 1a), iteration time vs tokens (Fig. 6/9), pipeline stage timelines (bubbles), capacity
bars (Fig. 10) and capacity vs SLO (Fig. 12)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sarathi.benchmark.metrics_store import MetricsStore
from sarathi.metrics import percentile

# A gap this many times the run's median TBT is drawn as a stall.
STALL_FACTOR = 3.0
# Requests drawn per scheduler in the token timeline.
TIMELINE_REQUESTS = 12


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdf(runs: Mapping[str, MetricsStore], metric: str, path: str | Path, title: str) -> Path:
    """One empirical CDF line per run of ``metric`` ('tbt', 'ttft', ...), in milliseconds."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, store in runs.items():
        points = store.cdf(metric)
        if points:
            ax.step([v * 1e3 for v, _ in points], [p for _, p in points], where="post", label=label)
    ax.set_xlabel(f"{title} (ms)")
    ax.set_ylabel("CDF")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"{title} CDF")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_token_timelines(runs: Mapping[str, MetricsStore], path: str | Path) -> Path:
    """Per run: output tokens of each request over time, with generation stalls (gaps longer than
    ``STALL_FACTOR`` x the run's median TBT) in red, and the run's total tokens generated on a second axis.

    The requests drawn are the ``TIMELINE_REQUESTS`` that decode while the most other requests arrive.
    """
    plt = _pyplot()
    n = max(1, len(runs))
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.8 * n), squeeze=False, sharex=True)
    for ax, (label, store) in zip(axes[:, 0], runs.items(), strict=True):
        recs = [r for r in store.requests.values() if len(r.token_times) > 1]
        if not recs:
            ax.set_title(f"{label}: no tokens")
            continue
        t0 = min(r.arrival_time for r in store.requests.values())
        median = percentile([g for r in recs for g in r.tbts], 50)
        arrivals = sorted(r.arrival_time for r in store.requests.values())

        def overlap(r, arrivals=arrivals):
            return sum(r.token_times[0] < a < r.token_times[-1] for a in arrivals)

        shown = sorted(
            sorted(recs, key=overlap, reverse=True)[:TIMELINE_REQUESTS], key=lambda r: r.arrival_time
        )
        for r in shown:
            xs = [t - t0 for t in r.token_times]
            ax.plot(xs, range(1, len(xs) + 1), color="tab:blue", lw=1)
            for i in range(1, len(xs)):
                if xs[i] - xs[i - 1] > STALL_FACTOR * median:
                    ax.plot(xs[i - 1 : i + 1], [i, i + 1], color="tab:red", lw=2)
        times = sorted(t - t0 for r in store.requests.values() for t in r.token_times)
        twin = ax.twinx()
        twin.plot(times, range(1, len(times) + 1), color="gray", lw=1, ls="--")
        twin.set_ylabel("all tokens", color="gray")
        ax.set_ylabel("tokens / request")
        ax.set_title(f"{label}: tokens over time (red: stalls > {STALL_FACTOR:g}x median TBT)")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("time since first arrival (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_iteration_times(runs: Mapping[str, MetricsStore], path: str | Path) -> Path | None:
    """Per run: iteration wall time vs tokens in the iteration, colored by the prefill share of its tokens
    (0 = decode-only). None when no run has iteration records (HTTP mode)."""
    runs = {k: v for k, v in runs.items() if v.iterations}
    if not runs:
        return None
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter

    n = len(runs)
    fig, axes = plt.subplots(
        1, n, figsize=(4.5 * n + 1, 3.8), squeeze=False, sharex=True, sharey=True, layout="constrained"
    )
    scatter = None
    for ax, (label, store) in zip(axes[0], runs.items(), strict=True):
        its = store.iterations
        scatter = ax.scatter(
            [it.num_tokens for it in its],
            [it.wall_time * 1e3 for it in its],
            c=[it.num_prefill_tokens / max(1, it.num_tokens) for it in its],
            cmap="coolwarm",
            vmin=0,
            vmax=1,
            s=8,
        )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("tokens in iteration")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("iteration time (ms)")
    fig.colorbar(scatter, ax=axes[0, :].tolist(), label="prefill share of tokens")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_capacity_bars(capacity: Mapping[str, Mapping[str, float]], path: str | Path) -> Path:
    """Grouped bars: capacity (QPS) per scheduler, one group per SLO label."""
    plt = _pyplot()
    slos = list(capacity)
    schedulers = list(dict.fromkeys(s for per in capacity.values() for s in per))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(slos) * max(1, len(schedulers)) / 2), 4))
    width = 0.8 / max(1, len(schedulers))
    for j, sched in enumerate(schedulers):
        xs = [i + (j - (len(schedulers) - 1) / 2) * width for i in range(len(slos))]
        ys = [capacity[slo].get(sched, 0.0) for slo in slos]
        bars = ax.bar(xs, ys, width, label=sched)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(len(slos)), slos)
    ax.set_ylabel("capacity (QPS)")
    ax.set_title("Capacity under the P99 TBT SLO")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_capacity_vs_slo(
    slos_s: Sequence[float], capacity: Mapping[str, Sequence[float]], path: str | Path
) -> Path:
    """Capacity (QPS) vs P99 TBT SLO (seconds), one line per scheduler."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for sched, caps in capacity.items():
        ax.plot(list(slos_s), list(caps), marker="o", label=sched)
    ax.set_xlabel("P99 TBT SLO (s)")
    ax.set_ylabel("capacity (QPS)")
    ax.set_xscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("Capacity vs TBT SLO")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_pipeline_timelines(
    runs: Mapping[str, MetricsStore], path: str | Path, window_s: float = 10.0
) -> Path | None:
    """Per run with two or more pipeline stages: each stage's busy intervals over the first
    ``window_s`` seconds (gaps are pipeline bubbles), shaded by the micro-batch's prefill share."""
    staged = {k: s for k, s in runs.items() if len({t.stage for t in s.stage_timings}) > 1}
    if not staged:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(staged), 1, figsize=(10, 1.2 + 1.1 * len(staged)), squeeze=False)
    for ax, (label, store) in zip(axes[:, 0], staged.items(), strict=True):
        t0 = min(t.start for t in store.stage_timings)
        prefill_share = {
            it.step_id: it.num_prefill_tokens / it.num_tokens for it in store.iterations if it.num_tokens
        }
        stages = sorted({t.stage for t in store.stage_timings})
        for t in store.stage_timings:
            if t.start - t0 > window_s:
                continue
            share = prefill_share.get(t.step_id, 0.0)
            color = plt.cm.viridis(0.15 + 0.75 * share)
            ax.broken_barh([(t.start - t0, t.end - t.start)], (t.stage - 0.4, 0.8), color=color)
        ax.set_yticks(stages, [f"stage {s}" for s in stages])
        ax.invert_yaxis()
        ax.set_xlim(0, window_s)
        ax.set_title(f"{label}: pipeline stages (gaps are bubbles; color: prefill share)", fontsize=9)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_bench(runs: Mapping[str, MetricsStore], folder: str | Path) -> list[Path]:
    """Every per-run plot of ``sarathi bench`` into ``folder``; returns the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [
        plot_cdf(runs, "tbt", folder / "tbt_cdf.png", "Time between tokens"),
        plot_cdf(runs, "ttft", folder / "ttft_cdf.png", "Time to first token"),
        plot_token_timelines(runs, folder / "tokens_over_time.png"),
    ]
    optional = [
        plot_iteration_times(runs, folder / "iteration_time_vs_tokens.png"),
        plot_pipeline_timelines(runs, folder / "pipeline_stages.png"),
    ]
    return paths + [p for p in optional if p is not None]
