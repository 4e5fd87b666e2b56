"""Structured-output masks on the sampling worker: one llguidance matcher per constrained request.

Building a matcher compiles the grammar against the whole vocabulary: up to seconds for a large schema.
It happens off the step loop: the engine sends ``prepare`` as soon as a constrained request arrives, a
background thread with a big stack (llguidance recurses) builds a pristine matcher, ``poll`` reports the
requests whose matcher is ready, and only then does the engine schedule them. Pristine matchers are kept
per constraint (least recently used first out), so requests sharing a schema compile it once, and a
request readmitted after preemption gets a copy that replays its outputs so far.

Before sampling, every constrained row's matcher writes its allowed-token bitmask (32 tokens per int32
word) into one batch tensor, which is unpacked with shifts and applied to those logit rows at once;
after sampling, each matcher consumes its row's token. Rows without a constraint cost nothing, and a
batch without any costs one dictionary check.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading

import torch

from sarathi.engine.step_messages import SampledToken
from sarathi.model import kernels
from sarathi.structured_output import (
    BIG_STACK_BYTES,
    ConstraintError,
    StructuredOutput,
    build_matcher,
    first_line,
    llg_tokenizer,
)

_KEPT_PRISTINE = 64
CONSTRAINT_FAILED = "invalid_structured_output"  # the error code of a row whose own constraint failed
_Key = tuple[str, str]


class GrammarMasks:
    """The matchers of the constrained requests this worker samples for, by request id."""

    def __init__(self, tokenizer_dir: str | None, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._tokenizer = None  # ~0.3 s for a 49k vocabulary, built in the background from the start
        self._tokenizer_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        if tokenizer_dir is not None:
            # llguidance holds the GIL while it builds its tokenizer (~0.2 s): built on the first constraint,
            # that stalled every running stream once; built now, it overlaps the engine's start-up instead.
            self._executor().submit(self._warm_tokenizer)
        self._pristine: collections.OrderedDict[_Key, concurrent.futures.Future] = collections.OrderedDict()
        self._preparing: dict[str, _Key] = {}  # request id -> its constraint, until the request is added
        self._matchers: dict[str, object] = {}
        self._errors: dict[str, str] = {}
        self._shifts = torch.arange(32, dtype=torch.int32)
        self._minus_inf = torch.tensor(float("-inf"))

    def __len__(self) -> int:
        return len(self._matchers) + len(self._errors)

    # --- building, off the step loop ------------------------------------------------------------------
    def prepare(self, request_id: str, constraint: StructuredOutput) -> None:
        """Start building ``request_id``'s matcher in the background (``poll`` says when it is ready)."""
        self._build(constraint)
        self._preparing[request_id] = (constraint.kind, constraint.spec)

    def poll(self, wait_s: float = 0.0) -> tuple[list[str], list[tuple[str, str]]]:
        """The prepared requests whose matcher is built, and those whose build failed (id, message);
        reported on every call until the request is added or removed. Waits up to ``wait_s`` for a
        build to finish when none has."""
        futures = {key: self._pristine.get(key) for key in set(self._preparing.values())}
        pending = [f for f in futures.values() if f is not None and not f.done()]
        if wait_s > 0 and pending and len(pending) == len(futures):
            concurrent.futures.wait(pending, timeout=wait_s, return_when=concurrent.futures.FIRST_COMPLETED)
        ready, failed = [], []
        for request_id, key in self._preparing.items():
            future = futures[key]
            if future is None:  # evicted before it was used: build it again
                futures[key] = self._build(StructuredOutput(*key))
            elif future.done():
                if (error := future.exception()) is None:
                    ready.append(request_id)
                else:
                    failed.append((request_id, _message(error)))
        return ready, failed

    def add(self, request_id: str, constraint: StructuredOutput, output_token_ids: list[int]) -> None:
        """``request_id``'s matcher, having consumed ``output_token_ids`` (its outputs so far): a copy of
        the pristine one (built now if it was not prepared)."""
        self.remove(request_id)
        try:
            matcher = self._build(constraint).result().deep_copy()
            if output_token_ids:
                matcher.consume_tokens(list(output_token_ids))
            if matcher.is_error():
                raise ConstraintError(first_line(matcher.get_error()))
        except Exception as e:
            self._errors[request_id] = f"structured output: {_message(e)}"
            return
        self._matchers[request_id] = matcher

    def remove(self, request_id: str) -> None:
        self._preparing.pop(request_id, None)
        self._matchers.pop(request_id, None)
        self._errors.pop(request_id, None)

    def _build(self, constraint: StructuredOutput) -> concurrent.futures.Future:
        key = (constraint.kind, constraint.spec)
        future = self._pristine.get(key)
        if future is None:
            future = self._pristine[key] = self._executor().submit(self._compile, constraint)
            if len(self._pristine) > _KEPT_PRISTINE:
                self._pristine.popitem(last=False)
        self._pristine.move_to_end(key)
        return future

    def _compile(self, constraint: StructuredOutput):
        return build_matcher(self._llg_tokenizer(), constraint)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            # Threads take the stack size in force when they start; the pool starts its one thread here.
            previous = threading.stack_size(BIG_STACK_BYTES)
            try:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sarathi-grammar")
                self._pool.submit(lambda: None).result()
            finally:
                threading.stack_size(previous)
        return self._pool

    def apply(self, logits: torch.Tensor, request_ids: list[str]) -> tuple[torch.Tensor, dict[int, str]]:
        """``logits`` (one row per id) with every constrained row's disallowed tokens at -inf, and the
        rows whose matcher failed (row -> error)."""
        if not len(self):
            return logits, {}
        failed = {i: self._errors[r] for i, r in enumerate(request_ids) if r in self._errors}
        rows = [i for i, r in enumerate(request_ids) if r in self._matchers]
        if not rows:
            return logits, failed
        words = (self.vocab_size + 31) // 32
        bitmask = torch.zeros((len(rows), words), dtype=torch.int32)
        row_bytes = words * 4
        for k, i in enumerate(rows):
            matcher = self._matchers[request_ids[i]]
            matcher.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), row_bytes)
            if matcher.is_error():
                failed[i] = f"structured output: {first_line(matcher.get_error())}"
        if kernels.available():  # one pass that skips fully allowed words
            masked = logits.to(torch.float32, copy=True)  # the model output may be an inference-mode tensor
            kernels.mask_logits_by_bitmask(masked, bitmask, torch.tensor(rows, dtype=torch.long))
            return masked, failed
        bits = (bitmask.unsqueeze(-1) >> self._shifts) & 1
        allowed = bits.view(len(rows), -1)[:, : logits.shape[1]].bool()
        logits = logits.float()
        if len(rows) == logits.shape[0]:
            return torch.where(allowed, logits, self._minus_inf), failed
        index = torch.tensor(rows)
        masked = logits.clone()  # the model's output may be an inference-mode tensor: never in place
        masked[index] = torch.where(allowed, logits[index], self._minus_inf)
        return masked, failed

    def advance(self, request_ids: list[str], sampled: list[SampledToken]) -> None:
        """Each constrained row's matcher consumes the token sampled for it."""
        if not self._matchers:
            return
        for request_id, token in zip(request_ids, sampled, strict=True):
            matcher = self._matchers.get(request_id)
            if matcher is not None and token.token_id is not None:
                matcher.consume_token(token.token_id)

    def _warm_tokenizer(self) -> None:
        with contextlib.suppress(ConstraintError):  # no tokenizer.json: each constraint reports it
            self._llg_tokenizer()

    def _llg_tokenizer(self):
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = llg_tokenizer(self.tokenizer_dir, self.vocab_size, self.eos_token_ids)
            return self._tokenizer


def _message(error: BaseException) -> str:
    """A build failure for the client: our own message, or the library's first line."""
    if isinstance(error, ConstraintError):
        return str(error)
    return f"{type(error).__name__}: {first_line(str(error))}"
