"""Iteration latency on this machine over a grid of (prefill tokens, decode batch size, context length).

Each grid point builds a real ``Batch`` of synthetic sequences whose first ``context_len`` tokens already
count as computed (their KV slots hold whatever the cache holds: only the timing matters, but the shapes,
block tables and attention metadata are the real ones), and times ``engine.executor.execute(step)``: the
model plus greedy sampling of the logits on the workers, i.e. one engine iteration without the scheduler's
bookkeeping.

A point (P, D, C) is ``D`` decodes, each over ``C`` cached tokens plus its one new token, and, if ``P > 0``,
one prefill chunk of ``P`` tokens of a sequence whose first ``C`` tokens are cached (the chunk attends to
those and to itself). These are the measurements behind the paper's cost curves (Fig. 3 and 4).
"""

from __future__ import annotations

import csv
import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi.core.batch import Batch
from sarathi.core.sequence import Sequence as Seq
from sarathi.metrics import percentile
from sarathi.sampling_params import GREEDY

if TYPE_CHECKING:
    from sarathi.engine.llm_engine import LLMEngine

_SEQ_PREFIX = "__profile-"


@dataclass(frozen=True)
class GridPoint:
    """One batch shape: ``prefill_tokens`` of one chunk, ``decode_batch_size`` decodes, ``context_len``."""

    prefill_tokens: int
    decode_batch_size: int
    context_len: int

    def __str__(self) -> str:
        return (
            f"grid point (prefill_tokens={self.prefill_tokens}, decode_batch_size={self.decode_batch_size}, "
            f"context_len={self.context_len})"
        )

    @property
    def num_tokens(self) -> int:
        """New tokens in the batch."""
        return self.prefill_tokens + self.decode_batch_size


@dataclass(frozen=True)
class ProfileResult:
    """Measured iteration time of one grid point, in milliseconds (median and 10th/90th percentiles)."""

    prefill_tokens: int
    decode_batch_size: int
    context_len: int
    num_tokens: int
    kind: str  # "prefill", "decode" or "mixed"
    repeats: int
    median_ms: float
    p10_ms: float
    p90_ms: float

    @property
    def ms_per_token(self) -> float:
        return self.median_ms / self.num_tokens

    @property
    def point(self) -> GridPoint:
        return GridPoint(self.prefill_tokens, self.decode_batch_size, self.context_len)


CSV_COLUMNS = [f.name for f in fields(ProfileResult)] + ["ms_per_token"]


def grid_points(
    prefill_tokens: Iterable[int], decode_batch_sizes: Iterable[int], context_lens: Iterable[int]
) -> list[GridPoint]:
    """The product of the three axes in (context, prefill, decode) order, without the empty (0, 0) batch."""
    ps, ds = list(prefill_tokens), list(decode_batch_sizes)
    return [GridPoint(p, d, c) for c in context_lens for p in ps for d in ds if p > 0 or d > 0]


def check_point(engine: LLMEngine, point: GridPoint) -> None:
    """Raise ValueError naming ``point`` if it is malformed or does not fit max_model_len or the KV pool."""
    p, d, c = point.prefill_tokens, point.decode_batch_size, point.context_len
    if min(p, d, c) < 0:
        raise ValueError(f"{point}: values must be >= 0")
    if p == 0 and d == 0:
        raise ValueError(f"{point}: the batch is empty (needs prefill tokens or decodes)")
    if d > 0 and c == 0:
        raise ValueError(f"{point}: a decode needs context_len >= 1")
    longest = max(c + p, c + 1 if d else 0)
    if longest > engine.max_model_len:
        raise ValueError(f"{point}: needs {longest} positions, max_model_len is {engine.max_model_len}")
    bm = engine.block_manager
    needed = d * bm.blocks_charged(c + 1) + (bm.blocks_charged(c + p) if p else 0)
    available = bm.num_available_blocks - bm.watermark_blocks
    if needed > available:
        raise ValueError(
            f"{point}: needs {needed} KV blocks, {available} are free "
            f"(pool of {bm.num_blocks} blocks of {bm.block_size} tokens)"
        )


def _synthetic_ids(n: int, salt: int, vocab: int) -> list[int]:
    # Arbitrary but valid token ids; the values do not affect the timing.
    return [(salt * 7919 + i * 104729) % vocab for i in range(n)]


def _build_batch(engine: LLMEngine, point: GridPoint) -> Batch:
    """Allocate blocks for the point's sequences and return its batch (the caller frees the blocks)."""
    vocab, c = engine.model.vocab_size, point.context_len
    batch = Batch()
    seqs: list[Seq] = []
    for i in range(point.decode_batch_size):
        seq = Seq(
            seq_id=f"{_SEQ_PREFIX}decode-{i}",
            prompt_token_ids=_synthetic_ids(c, i, vocab),
            sampling_params=GREEDY,
            arrival_time=0.0,
            max_model_len=engine.max_model_len,
            output_token_ids=_synthetic_ids(1, i + 1, vocab),
            num_computed_tokens=c,
            prefill_done=True,
        )
        seqs.append(seq)
    if point.prefill_tokens:
        seqs.append(
            Seq(
                seq_id=f"{_SEQ_PREFIX}prefill",
                prompt_token_ids=_synthetic_ids(c + point.prefill_tokens, -1, vocab),
                sampling_params=GREEDY,
                arrival_time=0.0,
                max_model_len=engine.max_model_len,
                num_computed_tokens=c,
            )
        )
    for seq in seqs:
        engine.block_manager.allocate(seq.seq_id, seq.num_tokens)
        engine.block_manager.materialize(seq.seq_id, seq.num_computed_tokens, seq.num_tokens)
        batch.add(seq, seq.num_uncomputed_tokens)
    return batch


def _free(engine: LLMEngine) -> None:
    for seq_id in engine.block_manager.seq_ids:
        if seq_id.startswith(_SEQ_PREFIX):
            engine.block_manager.free(seq_id)


def time_point(engine: LLMEngine, point: GridPoint, repeats: int = 5, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` timed iterations of ``point`` (after ``warmup`` untimed ones)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    check_point(engine, point)
    batch = _build_batch(engine, point)
    try:
        first = engine.step_builder.build(batch)
        again = dataclasses.replace(first, new_requests=[], freed_request_ids=[])
        times: list[float] = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            engine.executor.execute(first if i == 0 else again)
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times.append(elapsed)
        return times
    finally:
        for entry in batch:
            engine.step_builder.free(entry.seq.seq_id)
        _free(engine)


def summarize(point: GridPoint, seconds: Sequence[float]) -> ProfileResult:
    """A result from the timed iterations of ``point`` (in seconds)."""
    ms = [t * 1e3 for t in seconds]
    if point.prefill_tokens and point.decode_batch_size:
        kind = "mixed"
    else:
        kind = "prefill" if point.prefill_tokens else "decode"
    return ProfileResult(
        prefill_tokens=point.prefill_tokens,
        decode_batch_size=point.decode_batch_size,
        context_len=point.context_len,
        num_tokens=point.num_tokens,
        kind=kind,
        repeats=len(ms),
        median_ms=percentile(ms, 50),
        p10_ms=percentile(ms, 10),
        p90_ms=percentile(ms, 90),
    )


def profile_grid(
    engine: LLMEngine,
    points: Sequence[GridPoint],
    repeats: int = 5,
    warmup: int = 1,
    progress: bool = False,
    rewarm_tokens: int = 0,
) -> list[ProfileResult]:
    """Profile every point; all points are checked before any runs, so a bad grid fails at once.

    The repeats are interleaved (``repeats`` passes over the grid, warmups in the first pass) so that a
    burst of load from other processes spoils one sample of many points, not every sample of one point.
    Points of at most ``rewarm_tokens`` new tokens get their ``warmup`` runs in every pass: a short
    iteration right after a long one runs on the caches the long one left (a one-sequence decode of the
    embedded model on a 2-core Zen5: 4.6 ms after 64 decodes at context 1024, 3.6 ms after itself), where
    the engine's own iterations follow iterations of like size.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for point in points:
        check_point(engine, point)
    seconds: list[list[float]] = [[] for _ in points]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=repeats * len(points), desc="profile", unit="run")
    for n in range(repeats):
        for i, point in enumerate(points):
            again = n == 0 or point.num_tokens <= rewarm_tokens
            seconds[i] += time_point(engine, point, repeats=1, warmup=warmup if again else 0)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    return [summarize(p, s) for p, s in zip(points, seconds, strict=True)]


def measure_decode_iteration_time(
    engine: LLMEngine, batch_size: int, context_len: int, repeats: int = 5
) -> float:
    """Median seconds of a decode-only iteration of ``batch_size`` sequences over ``context_len`` tokens."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return percentile(time_point(engine, GridPoint(0, batch_size, context_len), repeats), 50)


def write_csv(results: Iterable[ProfileResult], path: str | Path) -> Path:
    """Write one row per result with ``CSV_COLUMNS``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({**asdict(r), "ms_per_token": r.ms_per_token})
    return path


def read_csv(path: str | Path) -> list[ProfileResult]:
    """Read results written by ``write_csv``."""
    types = {f.name: f.type for f in fields(ProfileResult)}
    out = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            values = {}
            for name, kind in types.items():
                raw = row[name]
                values[name] = int(raw) if kind == "int" else float(raw) if kind == "float" else raw
            out.append(ProfileResult(**values))
    return out
