"""Tensor- and pipeline-parallel sharding: which slice of the model a rank holds, and its process groups.

Ranks are laid out stage-major: global rank = pp_rank * tp_size + tp_rank, so the TP ranks of one pipeline
stage are consecutive. Every split is contiguous and as even as possible, earlier ranks taking the remainder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from sarathi.config import EngineConfig
from sarathi.model import shm_all_reduce
from sarathi.model.shm_all_reduce import SharedMemoryAllReduce


def even_split(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, end) of part `index` when `total` items are cut into `parts` contiguous runs, the first
    `total % parts` runs one item longer."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


@dataclass(frozen=True)
class ShardSpec:
    """Which part of the model one rank holds: TP shard `tp_rank` of `tp_size`, pipeline stage `pp_rank`
    of `pp_size`. The default is the whole model in one process."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def __post_init__(self) -> None:
        for what, rank, size in (("tp", self.tp_rank, self.tp_size), ("pp", self.pp_rank, self.pp_size)):
            if size < 1:
                raise ValueError(f"{what}_size must be >= 1, got {size}")
            if not 0 <= rank < size:
                raise ValueError(f"{what}_rank must be in [0, {size}), got {rank}")

    @property
    def world_size(self) -> int:
        """Processes serving one model: tp_size * pp_size."""
        return self.tp_size * self.pp_size

    @property
    def rank(self) -> int:
        """Global rank of this shard (stage-major)."""
        return self.global_rank(self.pp_rank, self.tp_rank)

    def global_rank(self, pp_rank: int, tp_rank: int) -> int:
        """Global rank of the shard at (pp_rank, tp_rank) in this layout."""
        return pp_rank * self.tp_size + tp_rank

    @property
    def is_first_stage(self) -> bool:
        """Whether this stage embeds the tokens."""
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        """Whether this stage computes the logits."""
        return self.pp_rank == self.pp_size - 1

    def layer_range(self, num_layers: int) -> tuple[int, int]:
        """[start, end) of the decoder layers this stage runs."""
        if num_layers < self.pp_size:
            raise ValueError(f"cannot split {num_layers} layers into {self.pp_size} pipeline stages")
        return even_split(num_layers, self.pp_size, self.pp_rank)

    def kv_head_range(self, num_kv_heads: int) -> tuple[int, int]:
        """[start, end) of the key/value heads this TP rank holds. With fewer kv heads than TP ranks (Gemma 3
        270M has one), each kv head is replicated on tp_size / num_kv_heads consecutive ranks."""
        if num_kv_heads >= self.tp_size:
            return even_split(num_kv_heads, self.tp_size, self.tp_rank)
        if self.tp_size % num_kv_heads:
            raise ValueError(
                f"cannot split {num_kv_heads} key/value heads across {self.tp_size} TP ranks "
                "(replicating them needs a TP size that is a multiple of the kv heads)"
            )
        head = self.tp_rank * num_kv_heads // self.tp_size
        return head, head + 1

    def q_head_range(self, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
        """[start, end) of the query heads of this rank's key/value head groups (a replicated kv head's
        query heads are split evenly over the ranks that share it)."""
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not form groups over {num_kv_heads} kv heads")
        per_group = num_heads // num_kv_heads
        start, end = self.kv_head_range(num_kv_heads)
        if num_kv_heads >= self.tp_size:
            return start * per_group, end * per_group
        sharing = self.tp_size // num_kv_heads
        if per_group % sharing:
            raise ValueError(
                f"cannot split {per_group} query heads per kv head across the {sharing} TP ranks sharing it"
            )
        share = per_group // sharing
        first = start * per_group + (self.tp_rank % sharing) * share
        return first, first + share

    def column_range(self, size: int) -> tuple[int, int]:
        """[start, end) of a column-parallel dimension (the MLP's intermediate size) on this TP rank."""
        if size < self.tp_size:
            raise ValueError(f"cannot split {size} columns across {self.tp_size} TP ranks")
        return even_split(size, self.tp_size, self.tp_rank)


WHOLE_MODEL = ShardSpec()  # the default: one process holds every layer and every head


def shards_of(config: EngineConfig) -> list[ShardSpec]:
    """Every rank's shard, in global rank order (pipeline stage major)."""
    p = config.parallel
    return [
        ShardSpec(tp_rank=t, tp_size=p.tensor_parallel_size, pp_rank=s, pp_size=p.pipeline_parallel_size)
        for s in range(p.pipeline_parallel_size)
        for t in range(p.tensor_parallel_size)
    ]


class TensorParallelGroup:
    """Sum all-reduce across the TP ranks of one pipeline stage.

    With size 1 it is a no-op that never touches torch.distributed. `group=None` with size > 1 is a model
    built without processes (to inspect its weights): running it raises. With `shared` (ranks on one
    host, sarathi/model/shm_all_reduce.py) float32 sums go through shared memory, the rest through gloo.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        size: int = 1,
        shared: SharedMemoryAllReduce | None = None,
    ) -> None:
        self.group, self.size, self.shared = group, size, shared

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` across the group in place; returns it."""
        if self.size == 1:
            return tensor
        if self.group is None:
            raise RuntimeError(f"a model sharded over {self.size} TP ranks needs a tp_group to run")
        if self.shared is not None and tensor.dtype == torch.float32:
            return self.shared.all_reduce(tensor)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def close(self) -> None:
        """Release the shared-memory segment, if any."""
        if self.shared is not None:
            self.shared.close()
            self.shared = None


@dataclass
class ParallelContext:
    """This process's place in the parallel layout: its TP group and the pipeline activation channel."""

    shard: ShardSpec
    tp_group: TensorParallelGroup
    # Sends in flight: the tensor must stay alive (and unmodified) until its send completes.
    _pending: list[tuple[dist.Work, torch.Tensor]] = field(default_factory=list)

    def send_to_next_stage(self, tensor: torch.Tensor) -> None:
        """Start sending `tensor` to the same TP rank of the next stage and return without waiting.

        The caller must not modify `tensor` afterwards (the model's outputs are fresh tensors).
        """
        if self.shard.is_last_stage:
            raise RuntimeError("the last pipeline stage has no next stage")
        self._reap_sends()
        tensor = tensor.contiguous()
        dst = self.shard.global_rank(self.shard.pp_rank + 1, self.shard.tp_rank)
        self._pending.append((dist.isend(tensor, dst=dst), tensor))

    def recv_from_prev_stage(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """Block until the previous stage's tensor of this shape and dtype arrives; returns it."""
        if self.shard.is_first_stage:
            raise RuntimeError("the first pipeline stage has no previous stage")
        tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(tensor, src=self.shard.global_rank(self.shard.pp_rank - 1, self.shard.tp_rank))
        return tensor

    def wait_sends(self) -> None:
        """Block until every send started here has completed."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()

    def _reap_sends(self) -> None:
        self._pending = [(work, t) for work, t in self._pending if not work.is_completed()]

    def destroy(self) -> None:
        """Finish pending sends and tear down the process groups (no-op in a single process)."""
        self.wait_sends()
        self.tp_group.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def init_distributed(
    shard: ShardSpec,
    init_method: str,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    shared_memory: bool | None = None,
) -> ParallelContext:
    """Join the process group of `shard.world_size` ranks and create one TP group per pipeline stage.

    Every rank must call this (it creates every stage's group, in the same order everywhere). init_method is
    a torch.distributed URL: tcp://127.0.0.1:PORT or file:///path. Use gloo for CPU tensors (nccl only for
    CUDA ones). A world of one process initializes nothing. `shared_memory`: sum the TP group's float32
    all-reduces through shared memory (None: as ALL_REDUCE_ENV says, by default where its ranks share a
    host that supports it; False: gloo).
    """
    if shared_memory is None:
        shared_memory = _all_reduce_setting()
    if shard.world_size == 1:
        return ParallelContext(shard, TensorParallelGroup())
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend, init_method=init_method, world_size=shard.world_size, rank=shard.rank, timeout=timeout
    )
    tp_group = TensorParallelGroup()
    if shard.tp_size > 1:
        for pp_rank in range(shard.pp_size):
            ranks = [shard.global_rank(pp_rank, t) for t in range(shard.tp_size)]
            group = dist.new_group(ranks, timeout=timeout, backend=backend)
            if pp_rank == shard.pp_rank:
                tp_group = TensorParallelGroup(group, shard.tp_size)
        if shared_memory is not False:
            tp_group.shared = _shared_all_reduce(
                shard, tp_group.group, timeout_s, required=bool(shared_memory)
            )
    return ParallelContext(shard, tp_group)


ALL_REDUCE_ENV = "SARATHI_TP_ALL_REDUCE"  # auto (the default), shm (required) or gloo


def _all_reduce_setting() -> bool | None:
    value = os.environ.get(ALL_REDUCE_ENV, "auto").strip().lower() or "auto"
    choices = {"auto": None, "shm": True, "gloo": False}
    if value not in choices:
        raise ValueError(f"{ALL_REDUCE_ENV}={value!r}: expected one of {', '.join(choices)}")
    return choices[value]


def _shared_all_reduce(
    shard: ShardSpec, group: dist.ProcessGroup, timeout_s: float, required: bool
) -> SharedMemoryAllReduce | None:
    """The TP group's shared-memory all-reduce when every rank of the group can use it on one host (they
    agree over gloo); its first rank creates the segment, every rank maps it, then it is unlinked."""
    import socket

    first = shard.global_rank(shard.pp_rank, 0)
    here = (socket.gethostname(), shm_all_reduce.supported(shard.world_size))
    hosts: list = [None] * shard.tp_size
    dist.all_gather_object(hosts, here, group=group)
    if not all(ok and host == hosts[0][0] for host, ok in hosts):
        if required:
            raise RuntimeError(f"the shared-memory all-reduce needs the TP ranks on one x86 host: {hosts}")
        return None
    path = [shm_all_reduce.create_segment(shard.tp_size) if shard.tp_rank == 0 else None]
    dist.broadcast_object_list(path, src=first, group=group)
    try:
        shared = SharedMemoryAllReduce(path[0], shard.tp_rank, shard.tp_size, timeout_s)
    finally:
        dist.barrier(group=group)
        if shard.tp_rank == 0:
            os.unlink(path[0])
    return shared


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads for each of `world_size` processes sharing this machine's cores (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // world_size)
