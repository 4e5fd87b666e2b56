"""The report of benchmarks/vs_llama_cpp.py: per SLO the compared capacities (llama.cpp's best -b, sarathi's
default and tuned budgets), side-by-side percentiles at shared loads, the printed summary and the plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from benchmarks.serving_probes import (
    LENGTH_SCALE,
    MAX_TOTAL_TOKENS,
    SLOS,
    ServerSetting,
    SettingResult,
    best_setting,
    cdf_load,
    shared_loads,
)


def compare(
    results: Sequence[SettingResult], tuned: dict[str, int], default_budget: int, sims: dict, qps_start: float
) -> dict:
    """Per SLO the compared rows (llama.cpp's best -b, sarathi default, sarathi tuned) with capacities, and
    the TTFT/TBT percentiles of those settings at every load all of them were probed at."""
    llama = [r for r in results if r.setting.server == "llama.cpp"]
    by_setting = {r.setting: r for r in results}
    per_slo, below, roles, compared = {}, {}, {}, {}
    for slo in SLOS:
        rows = {}
        if llama:
            rows["llama.cpp best"] = best_setting(llama, slo)
        rows["sarathi default"] = by_setting[ServerSetting("sarathi", default_budget)]
        rows["sarathi tuned"] = by_setting[ServerSetting("sarathi", tuned[slo.label])]
        per_slo[slo.label] = {role: r.capacity[slo.label] for role, r in rows.items()}
        below[slo.label] = {role: r.lowest_failing[slo.label] for role, r in rows.items()}
        roles[slo.label] = {role: r.setting.label for role, r in rows.items()}
        for r in rows.values():
            compared[r.setting.label] = r
    chosen = list(compared.values())
    loads = shared_loads(chosen)
    at_loads = {
        f"{q:g}": {
            r.setting.label: {
                k: r.probes[q].row()[k]
                for k in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "foreign_load", "disturbed")
            }
            for r in chosen
        }
        for q in loads
    }
    return {
        "capacity_qps": per_slo,
        "compared": roles,
        "lowest_failing_qps": below,
        "llama_cpp_capacity_qps": {r.setting.label: r.capacity for r in llama},
        "sarathi_tuned_budget": tuned,
        "sarathi_simulated_capacity_qps": sims,
        "qps_start": qps_start,
        "compared_settings": list(compared),
        "shared_loads": at_loads,
        "cdf_load_qps": cdf_load(chosen, SLOS[-1]),
    }


def capacity_text(capacity: float, lowest_failing: float | None) -> str:
    """'2.83', or '<1' when even the lowest load probed missed the SLO (the search ran out of probes)."""
    if capacity > 0 or lowest_failing is None:
        return f"{capacity:.3g}"
    return f"<{lowest_failing:.3g}"


def print_report(comparison: dict, results: Sequence[SettingResult]) -> None:
    for trace, c in comparison.items():
        print(f"\n=== {trace} (lengths x{LENGTH_SCALE:g}, <= {MAX_TOTAL_TOKENS} tokens, Poisson)")
        print("capacity (QPS): P99 TBT within the SLO, median TTFT <= 2 s")
        for slo, rows in c["capacity_qps"].items():
            below = c["lowest_failing_qps"][slo]
            print(
                f"  {slo}: "
                + "; ".join(
                    f"{role} ({c['compared'][slo][role]}) {capacity_text(cap, below[role])}"
                    for role, cap in rows.items()
                )
            )
        print(
            "  all llama.cpp settings: "
            + "; ".join(
                f"{label} " + "/".join(f"{v:.3g}" for v in caps.values())
                for label, caps in c["llama_cpp_capacity_qps"].items()
            )
        )
        print("at shared loads (ms): TTFT p50 / p99, TBT p50 / p99")
        for q, per in c["shared_loads"].items():
            print(f"  {q} QPS")
            for label, m in per.items():
                vals = " / ".join(
                    "-" if m[k] is None else f"{m[k] * 1e3:.0f}" for k in ("ttft_p50", "ttft_p99")
                )
                tbt = " / ".join("-" if m[k] is None else f"{m[k] * 1e3:.0f}" for k in ("tbt_p50", "tbt_p99"))
                flag = "  DISTURBED" if m["disturbed"] else ""
                print(f"    {label:<22} TTFT {vals:>13}   TBT {tbt:>11}{flag}")


def write_plots(comparison: dict, results: Sequence[SettingResult], out: Path) -> list[Path]:
    from sarathi.benchmark.plots import plot_capacity_bars, plot_cdf

    paths = []
    for trace, c in comparison.items():
        name = trace.replace(" ", "_")  # "<model> <quant> <workload>"
        paths.append(plot_capacity_bars(c["capacity_qps"], out / f"capacity_bars_{name}.png"))
        q = c["cdf_load_qps"]
        if q is None:
            continue
        stores = {
            r.setting.label: r.probes[q].store
            for r in results
            if r.workload == trace and r.setting.label in c["compared_settings"]
        }
        for metric in ("tbt", "ttft"):
            paths.append(
                plot_cdf(
                    stores,
                    metric,
                    out / f"{metric}_cdf_{name}.png",
                    f"{metric.upper()} at {q:g} QPS ({trace})",
                )
            )
    return paths
