"""GPUs and the links between them, as the analytic latency model sees them: peak rates and capacities.

Pure Python. Peaks are the vendors' dense (no sparsity) bf16 tensor-core FLOP/s and HBM bandwidth; how much
of them a real kernel gets is the analytic model's ``Calibration``. Memory is the capacity torch reports
(a little under the marketing figure). Link bandwidths are what a collective achieves per direction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30


@dataclass(frozen=True)
class GPU:
    """One accelerator: dense bf16 peak FLOP/s, memory bandwidth (bytes/s) and memory capacity (bytes)."""

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float


@dataclass(frozen=True)
class Link:
    """A GPU-to-GPU link: achievable bytes/s per direction and the fixed latency of one message."""

    name: str
    bandwidth: float
    latency_s: float

    def transfer_time(self, num_bytes: float) -> float:
        """Seconds to send ``num_bytes`` point to point."""
        return self.latency_s + num_bytes / self.bandwidth

    def all_reduce_time(self, num_bytes: float, num_gpus: int) -> float:
        """Seconds for a ring all-reduce of ``num_bytes`` over ``num_gpus``: 2(n-1) steps, each moving 1/n
        of the data and paying the message latency."""
        if num_gpus <= 1:
            return 0.0
        steps = 2 * (num_gpus - 1)
        return steps * self.latency_s + steps / num_gpus * num_bytes / self.bandwidth

    def all_gather_time(self, num_bytes: float, num_gpus: int) -> float:
        """Seconds for a ring all-gather whose result is ``num_bytes``: n-1 steps of 1/n of it each."""
        if num_gpus <= 1:
            return 0.0
        steps = num_gpus - 1
        return steps * self.latency_s + steps / num_gpus * num_bytes / self.bandwidth


@dataclass(frozen=True)
class Hardware:
    """Nodes of ``gpus_per_node`` identical GPUs: ``intra_node`` links within a node, ``inter_node`` between.

    GPUs are numbered node by node, and a replica's ranks stage-major (the TP group of one pipeline stage on
    consecutive GPUs), as the engine lays them out.
    """

    name: str
    gpu: GPU
    intra_node: Link
    inter_node: Link
    gpus_per_node: int = 8

    def link_between(self, gpu_a: int, gpu_b: int) -> Link:
        """The link that joins GPUs ``gpu_a`` and ``gpu_b``."""
        same_node = gpu_a // self.gpus_per_node == gpu_b // self.gpus_per_node
        return self.intra_node if same_node else self.inter_node

    def tensor_parallel_link(self, tp: int, stage: int = 0) -> Link:
        """The slowest link inside the TP group of pipeline stage ``stage`` (``tp`` consecutive GPUs)."""
        return self.link_between(stage * tp, stage * tp + tp - 1)

    def pipeline_link(self, tp: int, stage: int) -> Link:
        """The link stage ``stage`` sends its activations over to stage ``stage + 1``."""
        return self.link_between(stage * tp, (stage + 1) * tp)


A100_80GB = GPU("A100-80GB SXM", peak_flops=312e12, memory_bandwidth=2.0e12, memory_bytes=79.15 * GIB)
H100_80GB = GPU("H100-80GB SXM", peak_flops=989e12, memory_bandwidth=3.35e12, memory_bytes=79.1 * GIB)
# The paper runs LLaMA2-70B on A40s (PCIe cards: 48 GB GDDR6).
A40 = GPU("A40", peak_flops=149.7e12, memory_bandwidth=696e9, memory_bytes=44.4 * GIB)

NVLINK_A100 = Link("NVLink 3 (A100)", bandwidth=300e9, latency_s=5e-6)
NVLINK_H100 = Link("NVLink 4 (H100)", bandwidth=450e9, latency_s=5e-6)
PCIE_GEN4 = Link("PCIe Gen4 x16", bandwidth=25e9, latency_s=10e-6)
ETHERNET_100G = Link("100 Gb Ethernet", bandwidth=12e9, latency_s=25e-6)

HARDWARE: dict[str, Hardware] = {
    "a100-80gb": Hardware("a100-80gb", A100_80GB, NVLINK_A100, ETHERNET_100G),
    "h100-80gb": Hardware("h100-80gb", H100_80GB, NVLINK_H100, ETHERNET_100G),
    "a40": Hardware("a40", A40, PCIE_GEN4, ETHERNET_100G),
}


def get_hardware(name: str, gpus_per_node: int | None = None) -> Hardware:
    """A preset by name (``a100-80gb``, ``h100-80gb``, ``a40``), optionally with another node size (the
    paper's Falcon-180B runs on two nodes of 4 A100s: ``get_hardware("a100-80gb", 4)``); ValueError lists
    the presets for an unknown name."""
    try:
        hw = HARDWARE[name.lower()]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r} (choose from {', '.join(HARDWARE)})") from None
    if gpus_per_node is None:
        return hw
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    return replace(hw, gpus_per_node=gpus_per_node)
