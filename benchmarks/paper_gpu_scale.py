"""The Sarathi-Serve paper's GPU experiments, in simulation: the engine's own schedulers and block manager,
iteration times from the analytic GPU model (calibrated to the paper's Yi-34B points).

Sections (all by default; ``--sections`` picks some):
- ``capacity`` (Fig. 10/11): the highest QPS with P99 TBT within the strict / relaxed SLO and median
  scheduling delay <= 2 s, for sarathi (token budget 512 strict, 2048 relaxed; 1536 for Llama-2-70B),
  vllm and orca (max 128 running requests), on sharegpt and arxiv, for Mistral-7B on 1 A100, Yi-34B on
  2 A100 (TP2), Llama-2-70B on 8 A40 (TP4 x PP2) and Falcon-180B on two nodes of 4 A100 (TP4 x PP2).
- ``ablation`` (Table 4): Yi-34B TP2 at one load: hybrid batching only (sarathi, budget = context),
  chunked prefills only (simple_chunking, 512) and both (sarathi, 512): P50 TTFT and P99 TBT.
- ``tradeoff`` (Fig. 12): Mistral-7B on one A100, sharegpt: capacity as the P99 TBT SLO goes from 50 ms to
  1 s, for sarathi at budgets 512 and 2048 and vllm at 32, 64 and 128 running requests.
- ``pp_vs_tp`` (Fig. 13): Falcon-180B on two 4-GPU nodes, TP8 across the nodes vs TP4 x PP2, sarathi and
  vllm at one load: median and P99 TBT, pipeline bubbles, and relaxed-SLO capacity.

The paper's headline gains over vLLM are printed beside ours. Saves rows with machine and commit:

    .venv/bin/python -m benchmarks.paper_gpu_scale
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass

from benchmarks.record import save_result
from sarathi.benchmark.capacity import Probe, SearchSettings, Slo, find_capacity
from sarathi.benchmark.workload import WorkloadConfig
from sarathi.config import engine_config
from sarathi.simulator.cluster import simulate_one
from sarathi.simulator.gpu import gpu_simulation
from sarathi.simulator.model_spec import ModelSpec

# The paper's headline capacity gains of Sarathi-Serve over vLLM (abstract, OSDI'24), best case.
PAPER_GAIN_OVER_VLLM = {"mistral-7b": 2.6, "yi-34b": 3.7, "falcon-180b": 5.6}


@dataclass(frozen=True)
class Deployment:
    """A model on a GPU layout with the paper's SLOs and token budgets."""

    model: str
    hardware: str
    tp: int
    pp: int
    slos: tuple[float, float]  # strict, relaxed P99 TBT (s)
    budgets: tuple[int, int]  # sarathi's token budget for strict, relaxed
    gpus_per_node: int | None = None

    @property
    def label(self) -> str:
        return f"{self.model} {self.tp * self.pp}x{self.hardware} TP{self.tp}xPP{self.pp}"


DEPLOYMENTS = (
    Deployment("mistral-7b", "a100", 1, 1, (0.1, 0.5), (512, 2048)),
    Deployment("yi-34b", "a100", 2, 1, (0.2, 1.0), (512, 2048)),
    Deployment("llama-2-70b", "a40", 4, 2, (1.0, 5.0), (512, 1536)),
    Deployment("falcon-180b", "a100", 4, 2, (1.0, 5.0), (512, 2048), gpus_per_node=4),
)
TRACE_CAPS = {"sharegpt": 8192, "arxiv": 4096}


def workload(trace: str, dep: Deployment, num_requests: int, qps: float | None = 1.0) -> WorkloadConfig:
    context = ModelSpec.load(dep.model).max_position_embeddings
    return WorkloadConfig(
        trace=trace, num_requests=num_requests, qps=qps, max_total_tokens=min(TRACE_CAPS[trace], context)
    )


def simulation(dep: Deployment, scheduler: str, budget: int, tp: int | None = None, pp: int | None = None):
    config = engine_config(
        scheduler=scheduler,
        token_budget=budget,
        max_num_seqs=128,
        tensor_parallel_size=tp or dep.tp,
        pipeline_parallel_size=pp or dep.pp,
    )
    return gpu_simulation(config, dep.model, dep.hardware, dep.gpus_per_node)


def summary(sim, w: WorkloadConfig) -> dict:
    return simulate_one(*sim, w).summary()


def capacity(sim, w: WorkloadConfig, slo: Slo, probes: dict, settings: SearchSettings) -> float:
    def measure(qps: float) -> Probe:
        if qps not in probes:
            s = summary(sim, dataclasses.replace(w, qps=qps))
            probes[qps] = Probe(qps, s["tbt_p99"], s["scheduling_delay_p50"])
        return probes[qps]

    return find_capacity(measure, slo, settings).capacity


def capacity_section(args, settings) -> list[dict]:
    rows = []
    for dep in DEPLOYMENTS:
        for trace in args.traces.split(","):
            w = workload(trace, dep, args.num_requests)
            shared: dict[str, dict] = {"vllm": {}, "orca": {}}  # baselines ignore the budget: share probes
            for kind, slo_s, budget in zip(("strict", "relaxed"), dep.slos, dep.budgets, strict=True):
                slo = Slo(kind, slo_s)
                row = {
                    "section": "capacity",
                    "deployment": dep.label,
                    "trace": trace,
                    "slo": kind,
                    "tbt_slo_s": slo_s,
                    "sarathi_budget": budget,
                }
                for name in ("sarathi", "vllm", "orca"):
                    sim = simulation(dep, name, budget)
                    probes = shared.get(name, {})
                    row[f"{name}_qps"] = capacity(sim, w, slo, probes, settings)
                row["gain_over_vllm"] = row["sarathi_qps"] / row["vllm_qps"] if row["vllm_qps"] else None
                row["gain_over_orca"] = row["sarathi_qps"] / row["orca_qps"] if row["orca_qps"] else None
                rows.append(row)
                print(
                    f"{dep.label:<36}{trace:<9}{kind:<8}(P99 TBT <= {slo_s:g} s): "
                    f"sarathi {row['sarathi_qps']:.3g}"
                    f"  vllm {row['vllm_qps']:.3g}  orca {row['orca_qps']:.3g} QPS"
                    f"  gain over vllm {_ratio(row['gain_over_vllm'])}",
                    flush=True,
                )
    print("\nbest gain over vLLM per model (ours vs the paper's headline):")
    for dep in DEPLOYMENTS:
        gains = [r["gain_over_vllm"] for r in rows if r["deployment"] == dep.label and r["gain_over_vllm"]]
        paper = PAPER_GAIN_OVER_VLLM.get(dep.model)
        print(f"  {dep.label:<36} ours {_ratio(max(gains, default=None))}  paper {_ratio(paper)}")
    return rows


def ablation_section(args) -> list[dict]:
    dep = DEPLOYMENTS[1]
    rows = []
    context = ModelSpec.load(dep.model).max_position_embeddings
    for trace in args.traces.split(","):
        w = workload(trace, dep, args.num_requests, qps=args.ablation_qps)
        for label, name, budget in (
            ("hybrid batching only", "sarathi", context),
            ("chunked prefills only", "simple_chunking", 512),
            ("both (sarathi-serve)", "sarathi", 512),
        ):
            s = summary(simulation(dep, name, budget), w)
            rows.append(
                {
                    "section": "ablation",
                    "deployment": dep.label,
                    "trace": trace,
                    "variant": label,
                    "qps": args.ablation_qps,
                    "ttft_p50": s["ttft_p50"],
                    "tbt_p99": s["tbt_p99"],
                }
            )
            print(
                f"{dep.label} {trace:<9}{label:<24}TTFT p50 {s['ttft_p50']:.2f} s  "
                f"TBT p99 {s['tbt_p99']:.3f} s",
                flush=True,
            )
    return rows


def tradeoff_section(args, settings) -> list[dict]:
    dep = DEPLOYMENTS[0]
    w = workload("sharegpt", dep, args.num_requests)
    configs = [
        ("sarathi", 512, 128),
        ("sarathi", 2048, 128),
        ("vllm", 512, 32),
        ("vllm", 512, 64),
        ("vllm", 512, 128),
    ]
    rows = []
    for name, budget, seqs in configs:
        config = engine_config(scheduler=name, token_budget=budget, max_num_seqs=seqs)
        sim = gpu_simulation(config, dep.model, dep.hardware)
        probes: dict = {}  # shared by every SLO of this config
        label = f"{name} budget {budget}" if name == "sarathi" else f"{name} max {seqs} running"
        caps = []
        for slo_s in (0.05, 0.1, 0.2, 0.5, 1.0):
            cap = capacity(sim, w, Slo(f"{slo_s:g}", slo_s), probes, settings)
            caps.append(cap)
            rows.append(
                {
                    "section": "tradeoff",
                    "deployment": dep.label,
                    "config": label,
                    "tbt_slo_s": slo_s,
                    "capacity_qps": cap,
                }
            )
        print(
            f"{dep.label} sharegpt {label:<26}"
            + "  ".join(f"{c:.3g}" for c in caps)
            + "  QPS at P99 TBT 0.05/0.1/0.2/0.5/1 s",
            flush=True,
        )
    return rows


def pp_vs_tp_section(args, settings) -> list[dict]:
    dep = DEPLOYMENTS[3]
    rows = []
    w = workload("arxiv", dep, args.num_requests, qps=args.pp_qps)
    for layout, tp, pp in (("TP8 across nodes", 8, 1), ("TP4 x PP2", 4, 2)):
        for name, budget in (("sarathi", 2048), ("vllm", 2048)):
            sim = simulation(dep, name, budget, tp, pp)
            s = summary(sim, w)
            cap = capacity(sim, dataclasses.replace(w, qps=1.0), Slo("relaxed", dep.slos[1]), {}, settings)
            rows.append(
                {
                    "section": "pp_vs_tp",
                    "deployment": f"falcon-180b {layout}",
                    "scheduler": name,
                    "qps": args.pp_qps,
                    "tbt_p50": s["tbt_p50"],
                    "tbt_p99": s["tbt_p99"],
                    "bubble_fraction": s.get("pipeline_bubble_fraction"),
                    "relaxed_capacity_qps": cap,
                }
            )
            print(
                f"falcon-180b {layout:<18}{name:<8}TBT p50 {s['tbt_p50']:.3f} s  p99 {s['tbt_p99']:.3f} s  "
                f"bubbles {s.get('pipeline_bubble_fraction', 0):.1%}  relaxed capacity {cap:.3g} QPS",
                flush=True,
            )
    return rows


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="capacity,ablation,tradeoff,pp_vs_tp")
    p.add_argument("--traces", default="sharegpt,arxiv")
    p.add_argument("--num-requests", type=int, default=256, help="requests per simulated probe")
    p.add_argument("--max-probes", type=int, default=9)
    p.add_argument("--ablation-qps", type=float, default=1.0)
    p.add_argument("--pp-qps", type=float, default=0.3)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    settings = SearchSettings(
        qps_start=1.0, qps_min=0.01, qps_max=256.0, rel_tol=0.08, max_probes=args.max_probes
    )
    started = time.monotonic()
    rows = []
    sections = args.sections.split(",")
    if "capacity" in sections:
        rows += capacity_section(args, settings)
    if "ablation" in sections:
        rows += ablation_section(args)
    if "tradeoff" in sections:
        rows += tradeoff_section(args, settings)
    if "pp_vs_tp" in sections:
        rows += pp_vs_tp_section(args, settings)
    print(f"{time.monotonic() - started:.0f} s")
    if not args.no_save:
        print(f"saved {save_result('paper-gpu-scale', rows, vars(args))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
