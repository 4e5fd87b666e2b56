"""What a latency model needs to know of one iteration: how much prefill and decode work it holds.

Pure Python. A scheduled entry of one token is costed as a decode (a one-token prefill chunk does the same
work); longer entries are prefill chunks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchShape:
    """The work of one iteration.

    ``prefill_attention`` is the attention work of the prefill chunks, Σ over chunks of chunk tokens ×
    the mean context they attend to (``chunk × (start + (chunk + 1) / 2)``); ``decode_context`` is the
    Σ over decodes of the tokens each attends to (its cached tokens plus itself).
    """

    prefill_tokens: int = 0
    prefill_attention: float = 0.0
    num_prefills: int = 0
    num_decodes: int = 0
    decode_context: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.num_decodes

    @property
    def num_seqs(self) -> int:
        return self.num_prefills + self.num_decodes

    @property
    def is_empty(self) -> bool:
        return self.num_tokens == 0

    @classmethod
    def from_chunks(cls, chunks: list[tuple[int, int]]) -> BatchShape:
        """From ``(start, num_tokens)`` pairs: ``start`` tokens cached, ``num_tokens`` computed now."""
        prefill = attention = num_prefills = decodes = decode_context = 0
        for start, n in chunks:
            if n < 1 or start < 0:
                raise ValueError(f"a chunk needs num_tokens >= 1 and start >= 0, got ({start}, {n})")
            if n == 1:
                decodes += 1
                decode_context += start + 1
            else:
                num_prefills += 1
                prefill += n
                attention += n * (start + (n + 1) / 2)
        return cls(prefill, float(attention), num_prefills, decodes, decode_context)

    @classmethod
    def from_grid(cls, prefill_tokens: int, decode_batch_size: int, context_len: int) -> BatchShape:
        """The shape of a profiler grid point: one chunk of ``prefill_tokens`` after ``context_len`` cached
        tokens, and ``decode_batch_size`` decodes over ``context_len`` cached tokens each."""
        chunks = [(context_len, 1)] * decode_batch_size
        if prefill_tokens == 1:
            chunks.append((context_len, 1))
        elif prefill_tokens > 1:
            chunks.append((context_len, prefill_tokens))
        return cls.from_chunks(chunks)
