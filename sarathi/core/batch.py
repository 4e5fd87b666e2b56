"""The one batch type that flows from the scheduler to the model runner and to the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field

from sarathi.core.sequence import Sequence


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """``num_tokens`` tokens of ``seq`` starting at position ``start`` (its computed-token count).

    ``is_prefill`` and ``samples`` are fixed when the entry is made: a prefill chunk that does not reach
    the end of the sequence's tokens produces no new token.
    """

    seq: Sequence
    start: int
    num_tokens: int
    is_prefill: bool
    samples: bool

    @classmethod
    def next_tokens(cls, seq: Sequence, num_tokens: int) -> BatchEntry:
        """The next ``num_tokens`` uncomputed tokens of ``seq``."""
        if not 0 < num_tokens <= seq.num_uncomputed_tokens:
            raise ValueError(
                f"cannot schedule {num_tokens} tokens of {seq.seq_id}: "
                f"{seq.num_uncomputed_tokens} are uncomputed"
            )
        start = seq.num_computed_tokens
        return cls(
            seq=seq,
            start=start,
            num_tokens=num_tokens,
            is_prefill=seq.is_prefill,
            samples=start + num_tokens == seq.num_tokens,
        )

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass
class Batch:
    """One iteration: an ordered list of entries (prefill chunks and decodes may mix).

    ``preempted`` lists the sequences the scheduler preempted while forming this batch; the prefix-cache
    counts are the tokens of the sequences it admitted (queries) and how many of them were found in
    the cache (hits), both 0 when caching is off.
    """

    entries: list[BatchEntry] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    def add(self, seq: Sequence, num_tokens: int) -> BatchEntry:
        entry = BatchEntry.next_tokens(seq, num_tokens)
        self.entries.append(entry)
        return entry

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    @property
    def is_empty(self) -> bool:
        return not self.entries

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries if e.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries if not e.is_prefill)

    @property
    def num_seqs(self) -> int:
        return len(self.entries)

    @property
    def seq_ids(self) -> list[str]:
        return [e.seq.seq_id for e in self.entries]
