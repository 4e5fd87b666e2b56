"""An analytic latency model of GPUs we cannot run here: a roofline per layer, per pipeline stage.

Pure Python. Every operation takes the longer of its compute time (FLOPs at a fraction of the GPU's peak)
and its memory time (bytes at a fraction of the HBM bandwidth), on one GPU's tensor-parallel shard:

* linear layers (fused QKV, attention output, MLP up/gate and down): 2·tokens·in·out FLOPs against the
  shard's weights plus the activations in and out;
* prefill attention: 4·heads·head_dim FLOPs per unit of ``BatchShape.prefill_attention``, against reading
  the chunks' queries and the KV they attend to; decode attention: reading the KV of ``decode_context``
  tokens (and the same FLOPs per token attended);
* element-wise work (norms, residual adds, RoPE, the MLP activation, the KV-cache write): memory only;
* tensor parallelism: ring all-reduces of tokens × hidden activations (two per layer, one for Falcon's
  parallel attention), on the TP group's link;
* a fixed overhead per layer (kernel launches) and per iteration (the engine's scheduling and input
  preparation, charged to the first stage).

Not modelled: Mistral's sliding window (decodes read their whole context), overlap of communication with
compute, and GEMM tile quantisation (time is smooth in the token count).

Pipeline stages run their own layers (split as the engine splits them); each but the last sends tokens ×
hidden activations to the next, and the last runs the LM head over the sampled rows and gathers the logits.
The efficiencies and overheads are a ``Calibration``; the shipped one is fitted to the Sarathi-Serve paper's
published iteration times (``python -m sarathi.simulator.analytic_fit``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from sarathi.core.batch_shape import BatchShape
from sarathi.core.latency_model import LatencyModel
from sarathi.simulator.hardware import Hardware, Link
from sarathi.simulator.model_spec import ModelSpec

CALIBRATION_PATH = Path(__file__).parent / "data" / "analytic_calibration.json"


@dataclass(frozen=True)
class Calibration:
    """Fractions of the GPU's peaks real kernels reach, and the fixed costs a roofline leaves out.

    The field defaults are uncalibrated priors (typical of a well-tuned stack); ``Calibration.load()`` is
    the shipped fit to the paper.
    """

    compute_efficiency: float = 0.6  # linear layers' GEMMs, of peak FLOP/s
    bandwidth_efficiency: float = 0.8  # weight and activation streaming, of HBM bandwidth
    attention_compute_efficiency: float = 0.5  # prefill attention, of peak FLOP/s
    attention_bandwidth_efficiency: float = 0.6  # reading the KV cache, of HBM bandwidth
    layer_overhead_s: float = 30e-6  # per decoder layer: kernel launches and small kernels
    iteration_overhead_s: float = 2e-3  # per iteration: scheduling and input preparation

    def __post_init__(self) -> None:
        for name in EFFICIENCY_FIELDS:
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        for name in ("layer_overhead_s", "iteration_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown calibration fields: {', '.join(sorted(unknown))}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Calibration:
        """A calibration file's ``calibration`` (default: the shipped fit to the paper)."""
        data = json.loads(Path(path or CALIBRATION_PATH).read_text())
        return cls.from_json(data["calibration"])


EFFICIENCY_FIELDS = (
    "compute_efficiency",
    "bandwidth_efficiency",
    "attention_compute_efficiency",
    "attention_bandwidth_efficiency",
)


@dataclass(frozen=True)
class LayerCost:
    """Seconds one decoder layer takes on one GPU, by kind of work."""

    linear_s: float
    attention_s: float
    elementwise_s: float
    all_reduce_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.elementwise_s + self.all_reduce_s + self.overhead_s


@dataclass(frozen=True)
class StageCost:
    """Seconds of one pipeline stage: its layers, the LM head (last stage), the send to the next stage
    and the per-iteration overhead (first stage)."""

    num_layers: int
    layer: LayerCost
    lm_head_s: float
    send_s: float
    iteration_overhead_s: float

    @property
    def total_s(self) -> float:
        return self.num_layers * self.layer.total_s + self.lm_head_s + self.send_s + self.iteration_overhead_s


class AnalyticLatencyModel(LatencyModel):
    """Roofline iteration times of ``spec`` on ``hardware`` with TP × PP GPUs (see the module docstring)."""

    def __init__(
        self,
        spec: ModelSpec,
        hardware: Hardware,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        calibration: Calibration | None = None,
        dtype_bytes: int = 2,
    ) -> None:
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        if tp < 1 or pp < 1:
            raise ValueError(f"tensor and pipeline parallel sizes must be >= 1, got {tp} and {pp}")
        self.spec, self.hardware = spec, hardware
        self.tensor_parallel_size, self.num_stages = tp, pp
        self.calibration = calibration if calibration is not None else Calibration.load()
        self.dtype_bytes = dtype_bytes
        self._layers = spec.layers_per_stage(pp)

        cal, gpu = self.calibration, hardware.gpu
        self._flops = gpu.peak_flops * cal.compute_efficiency
        self._bw = gpu.memory_bandwidth * cal.bandwidth_efficiency
        self._attn_flops = gpu.peak_flops * cal.attention_compute_efficiency
        self._attn_bw = gpu.memory_bandwidth * cal.attention_bandwidth_efficiency

        hidden = spec.hidden_size
        self._q = spec.heads_per_gpu(tp) * spec.head_dim
        self._kv = spec.kv_heads_per_gpu(tp) * spec.head_dim
        inter = spec.intermediate_per_gpu(tp)
        up = (2 if spec.gated_mlp else 1) * inter
        self._gemms = ((hidden, self._q + 2 * self._kv), (self._q, hidden), (hidden, up), (inter, hidden))
        # Bytes per token of element-wise traffic: norms (read + write), two residual adds (2 reads, 1 write),
        # RoPE on q and k (read + write), the MLP activation (read its inputs, write its output) and the
        # KV-cache write (k and v).
        self._elementwise_bytes_per_token = dtype_bytes * (
            2 * spec.norms_per_layer * hidden
            + 6 * hidden
            + 2 * (self._q + self._kv)
            + up
            + inter
            + 2 * self._kv
        )
        self._kv_bytes_per_token = spec.kv_bytes_per_token(tp, dtype_bytes)
        self._vocab = spec.vocab_per_gpu(tp)
        self._all_reduces = 1 if spec.parallel_attention else 2
        self._tp_links = [hardware.tensor_parallel_link(tp, stage) for stage in range(pp)]
        self._pp_links = [hardware.pipeline_link(tp, stage) for stage in range(pp - 1)]

    def with_calibration(self, calibration: Calibration) -> AnalyticLatencyModel:
        """The same setup with another calibration."""
        return AnalyticLatencyModel(
            self.spec,
            self.hardware,
            self.tensor_parallel_size,
            self.num_stages,
            calibration,
            self.dtype_bytes,
        )

    # --- costs -------------------------------------------------------------------------------------------
    def _gemm_time(self, tokens: int, k: int, n: int) -> float:
        flops = 2.0 * tokens * k * n
        num_bytes = self.dtype_bytes * (k * n + tokens * (k + n))
        return max(flops / self._flops, num_bytes / self._bw)

    def _attention_time(self, shape: BatchShape) -> float:
        flops_per_pair = 4.0 * self._q  # QK^T and PV: 2 FLOPs each per head dimension
        t = 0.0
        if shape.num_prefills:
            # KV the chunks read: Σ (start + n) over chunks, exact for equal chunks.
            mean_chunk = shape.prefill_tokens / shape.num_prefills
            kv_tokens = shape.prefill_attention / mean_chunk + shape.num_prefills * (mean_chunk - 1) / 2
            num_bytes = (
                kv_tokens * self._kv_bytes_per_token + 2 * shape.prefill_tokens * self._q * self.dtype_bytes
            )
            t += max(flops_per_pair * shape.prefill_attention / self._attn_flops, num_bytes / self._attn_bw)
        if shape.num_decodes:
            num_bytes = (
                shape.decode_context * self._kv_bytes_per_token
                + 2 * shape.num_decodes * self._q * self.dtype_bytes
            )
            t += max(flops_per_pair * shape.decode_context / self._attn_flops, num_bytes / self._attn_bw)
        return t

    def layer_cost(self, shape: BatchShape, stage: int = 0) -> LayerCost:
        """One decoder layer's seconds on one GPU of pipeline stage ``stage`` for ``shape``."""
        tokens = shape.num_tokens
        activation_bytes = tokens * self.spec.hidden_size * self.dtype_bytes
        return LayerCost(
            linear_s=sum(self._gemm_time(tokens, k, n) for k, n in self._gemms),
            attention_s=self._attention_time(shape),
            elementwise_s=tokens * self._elementwise_bytes_per_token / self._bw,
            all_reduce_s=self._all_reduces
            * self._tp_links[stage].all_reduce_time(activation_bytes, self.tensor_parallel_size),
            overhead_s=self.calibration.layer_overhead_s,
        )

    def lm_head_time(self, shape: BatchShape) -> float:
        """The last stage's LM head over the rows that sample (every sequence: an upper bound, as chunks
        that do not finish their prompt sample nothing) and the gather of their logits across TP."""
        rows = shape.num_seqs
        gemm = self._gemm_time(rows, self.spec.hidden_size, self._vocab)
        gathered = rows * self._vocab * self.tensor_parallel_size * self.dtype_bytes
        link = self._tp_links[-1]
        return gemm + link.all_gather_time(gathered, self.tensor_parallel_size)

    def breakdown(self, shape: BatchShape) -> list[StageCost]:
        """Each pipeline stage's cost, by part."""
        if shape.is_empty:
            zero = LayerCost(0.0, 0.0, 0.0, 0.0, 0.0)
            return [StageCost(n, zero, 0.0, 0.0, 0.0) for n in self._layers]
        layers: dict[Link, LayerCost] = {}  # stages whose TP groups share a link cost the same per layer
        for stage, link in enumerate(self._tp_links):
            if link not in layers:
                layers[link] = self.layer_cost(shape, stage)
        activation_bytes = shape.num_tokens * self.spec.hidden_size * self.dtype_bytes
        last = self.num_stages - 1
        return [
            StageCost(
                num_layers=n,
                layer=layers[self._tp_links[stage]],
                lm_head_s=self.lm_head_time(shape) if stage == last else 0.0,
                send_s=self._pp_links[stage].transfer_time(activation_bytes) if stage < last else 0.0,
                iteration_overhead_s=self.calibration.iteration_overhead_s if stage == 0 else 0.0,
            )
            for stage, n in enumerate(self._layers)
        ]

    def stage_times(self, shape: BatchShape) -> list[float]:
        return [stage.total_s for stage in self.breakdown(shape)]

    def iteration_time(self, shape: BatchShape) -> float:
        return sum(self.stage_times(shape))
