"""A rank spawned by test_parallel_model: load one shard, run a fixed schedule of steps, save its logits.

Kept free of transformers (slow to import) so that spawned processes start fast.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import torch
from paged_runner import PagedRunner

from sarathi.model import ShardSpec, init_distributed, load_model

Step = list[tuple[str, list[int], int]]  # (sequence, new tokens, start position) per entry
BLOCK_SIZE = 4  # small: prompts and decodes cross block boundaries
NUM_BLOCKS = 32


def make_schedule(vocab_size: int, seed: int = 0) -> list[Step]:
    """Two sequences: first chunks, then a chunk reading the cache beside a decode, then decodes."""
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in (14, 9))
    return [
        [("a", a[0:7], 0), ("b", b[0:5], 0)],
        [("a", a[7:11], 7), ("b", b[5:6], 5)],
        [("b", b[6:7], 6), ("a", a[11:12], 11)],
        [("a", a[12:13], 12), ("b", b[7:8], 7)],
        [("a", a[13:14], 13), ("b", b[8:9], 8)],
    ]


def run_schedule(runner: PagedRunner, schedule: list[Step]) -> torch.Tensor | None:
    """Logits of every token of every step, concatenated (None on a stage without logits)."""
    outs = [logits for step in schedule for logits in runner.run(step)]
    return torch.cat(outs) if outs else None


def run_rank(
    shard: ShardSpec,
    init_method: str,
    model: str | None,
    load_kwargs: dict[str, Any],
    schedule: list[Step],
    out_dir: Path,
) -> None:
    """One spawned rank: logits to out_dir/logits_rank{rank}.pt, a traceback to error_rank{rank}.txt."""
    try:
        torch.set_num_threads(1)
        ctx = init_distributed(shard, init_method, timeout_s=60)
        net, arch, _ = load_model(model, shard=shard, tp_group=ctx.tp_group, **load_kwargs)
        runner = PagedRunner(net, arch, BLOCK_SIZE, NUM_BLOCKS, shard=shard, pipeline=ctx)
        logits = run_schedule(runner, schedule)
        if logits is not None:
            torch.save(logits, out_dir / f"logits_rank{shard.rank}.pt")
        ctx.destroy()
    except BaseException:
        (out_dir / f"error_rank{shard.rank}.txt").write_text(traceback.format_exc())
        raise
