"""The tensor-parallel group's shared-memory all-reduce: the exact float32 sum, the same bits on every rank,
at odd sizes, past one slot (in pieces) and on non-contiguous tensors; the same sums as gloo's; the segment
gone once mapped; a rank that never arrives named in an error."""

from __future__ import annotations

import os
import socket
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from sarathi.model import ShardSpec, init_distributed
from sarathi.model import shm_all_reduce as shm
from sarathi.model.shm_all_reduce import SharedMemoryAllReduce

pytestmark = pytest.mark.skipif(not shm.supported(2), reason="needs x86-64, /dev/shm and two cores")

# Odd sizes, a decode step's and one past a slot.
SHAPES = [(1,), (3, 7), (4, 576), (shm.SLOT_ELEMENTS + 5,), (64, 577)]


def _inputs(rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(shape, generator=gen) * 10 for shape in SHAPES]


def _rank(rank: int, size: int, port: int, shared: bool, out: Path) -> None:
    try:
        torch.set_num_threads(1)
        shard = ShardSpec(tp_rank=rank, tp_size=size)
        ctx = init_distributed(shard, f"tcp://127.0.0.1:{port}", timeout_s=60, shared_memory=shared)
        assert (ctx.tp_group.shared is not None) == shared
        results = []
        for x in _inputs(rank):
            results.append(ctx.tp_group.all_reduce(x.clone()))
        if shared:  # a non-contiguous tensor, summed in place (gloo refuses those)
            results.append(ctx.tp_group.all_reduce(_inputs(rank)[-1].t()).t())
        torch.save(results, out / f"{'shm' if shared else 'gloo'}-{rank}.pt")
        ctx.destroy()
    except BaseException:
        (out / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise


def _run(size: int, shared: bool, out: Path) -> list[list[torch.Tensor]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(size, port, shared, out), nprocs=size, start_method="spawn")
    errors = [p.read_text() for p in out.glob("error-*.txt")]
    assert not errors, errors[0]
    return [torch.load(out / f"{'shm' if shared else 'gloo'}-{r}.pt") for r in range(size)]


def test_sums_equal_on_every_rank_and_to_gloo(tmp_path: Path) -> None:
    before = set(os.listdir(shm.SHM_DIR))
    got = _run(2, True, tmp_path)
    assert set(os.listdir(shm.SHM_DIR)) <= before, "the segment must be unlinked once every rank mapped it"
    gloo = _run(2, False, tmp_path)
    inputs = [_inputs(r) for r in range(2)]
    for i in range(len(SHAPES)):
        expected = inputs[0][i] + inputs[1][i]
        assert torch.equal(got[0][i], expected) and torch.equal(got[1][i], expected), SHAPES[i]
        assert torch.equal(gloo[0][i], expected)
    assert torch.equal(got[0][-1], inputs[0][-1] + inputs[1][-1])


def test_a_rank_that_never_arrives_is_named() -> None:
    path = shm.create_segment(2)
    try:
        ar = SharedMemoryAllReduce(path, rank=0, size=2, timeout_s=0.2)
    finally:
        os.unlink(path)
    with pytest.raises(TimeoutError, match=r"ranks \[1\] did not arrive within 0.2 s"):
        ar.all_reduce(torch.ones(8))
    ar.close()


def test_only_float32_and_matching_segments() -> None:
    path = shm.create_segment(2)
    try:
        with pytest.raises(ValueError, match="not a segment for 3 ranks"):
            SharedMemoryAllReduce(path, rank=0, size=3)
        ar = SharedMemoryAllReduce(path, rank=0, size=2)
    finally:
        os.unlink(path)
    with pytest.raises(TypeError, match="float32"):
        ar.all_reduce(torch.ones(4, dtype=torch.bfloat16))
    ar.close()


def test_the_setting_names_its_choices(monkeypatch) -> None:
    from sarathi.model.parallel import ALL_REDUCE_ENV, _all_reduce_setting

    for value, expected in (("auto", None), ("", None), ("shm", True), ("GLOO", False)):
        monkeypatch.setenv(ALL_REDUCE_ENV, value)
        assert _all_reduce_setting() is expected
    monkeypatch.setenv(ALL_REDUCE_ENV, "nccl")
    with pytest.raises(ValueError, match=r"SARATHI_TP_ALL_REDUCE='nccl': expected one of auto, shm, gloo"):
        _all_reduce_setting()
