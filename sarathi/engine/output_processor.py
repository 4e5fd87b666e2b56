"""From sampled tokens to ``RequestOutput`` deltas: incremental detokenization and stop strings.

Runs in the engine, after the scheduler has accounted the step. Text that could still become a stop
string is held back until it is decided, so streamed text always equals the final text.
"""

from __future__ import annotations

from sarathi.core.schedulers import Scheduler
from sarathi.core.sequence import Sequence, SequenceStatus
from sarathi.engine.step_messages import PromptLogprobs
from sarathi.outputs import RequestMetrics, RequestOutput, TokenLogprob
from sarathi.tokenizer import IncrementalDetokenizer, Tokenizer


class OutputProcessor:
    """Per-request detokenizers and the stop-string check; finishes sequences that hit a stop string."""

    def __init__(self, tokenizer: Tokenizer | None, scheduler: Scheduler) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        if tokenizer is not None:
            _ = tokenizer.decode_bytes  # build the per-token bytes table now, not in the first request
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._emitted_chars: dict[str, int] = {}
        # Prompt log probabilities gathered chunk by chunk, until they go out with the first token.
        self._prompt_logprobs: dict[str, list[TokenLogprob | None]] = {}
        self._prompt_logprobs_sent: set[str] = set()
        self._logprobs: dict[str, list[TokenLogprob]] = {}  # the final output carries them all

    def add_request(self, seq: Sequence) -> None:
        if self.tokenizer is not None:
            self._detokenizers[seq.seq_id] = IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids)
            self._emitted_chars[seq.seq_id] = 0
        if seq.sampling_params.prompt_logprobs is not None:
            self._prompt_logprobs[seq.seq_id] = [None] * seq.num_prompt_tokens
        if seq.sampling_params.logprobs is not None:
            self._logprobs[seq.seq_id] = []

    def remove(self, request_id: str) -> None:
        self._detokenizers.pop(request_id, None)
        self._emitted_chars.pop(request_id, None)
        self._prompt_logprobs.pop(request_id, None)
        self._prompt_logprobs_sent.discard(request_id)
        self._logprobs.pop(request_id, None)

    def add_prompt_logprobs(self, chunks: list[PromptLogprobs]) -> None:
        """Record a step's prompt log probabilities (a recomputed chunk writes the same values again)."""
        for chunk in chunks:
            gathered = self._prompt_logprobs.get(chunk.request_id)
            if gathered is not None:
                gathered[chunk.start : chunk.start + len(chunk.logprobs)] = chunk.logprobs

    def token_output(
        self, seq: Sequence, token_id: int, now: float, logprob: TokenLogprob | None = None
    ) -> RequestOutput:
        """The delta for a token ``seq`` just got (already appended by the scheduler)."""
        detok = self._detokenizers.get(seq.seq_id)
        new_text = text = ""
        if detok is not None:
            delta = detok.add([token_id])
            if not seq.is_finished and seq.num_output_tokens > seq.sampling_params.min_tokens:
                self._check_stop_strings(seq, detok, delta, now)
            end = len(detok.text) if seq.is_finished else stop_safe_end(detok.text, seq.sampling_params.stop)
            start = self._emitted_chars[seq.seq_id]
            new_text = detok.text[start:end]
            self._emitted_chars[seq.seq_id] = max(start, end)
        finished = seq.is_finished
        all_logprobs = self._logprobs.get(seq.seq_id)
        if all_logprobs is not None and logprob is not None:
            all_logprobs.append(logprob)
        # The cumulative fields go on the last output only: copying them at every token is O(n^2).
        if finished and detok is not None:
            text = detok.text
        output = RequestOutput(
            request_id=seq.seq_id,
            new_token_ids=[token_id],
            new_text=new_text,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            finished=finished,
            finish_reason=seq.status.finish_reason,
            stop_reason=seq.stop_reason,
            metrics=RequestMetrics.of(seq) if finished else None,
            new_logprobs=None if logprob is None else [logprob],
            token_ids=list(seq.output_token_ids) if finished else None,
            text=text if finished else None,
            token_time=now,
            prompt_logprobs=self._prompt_logprobs_to_send(seq.seq_id, finished),
            logprobs=all_logprobs if finished else None,
            num_cached_tokens=seq.num_cached_tokens,
        )
        if seq.is_finished:
            self.remove(seq.seq_id)
        return output

    def _prompt_logprobs_to_send(self, request_id: str, finished: bool) -> list[TokenLogprob | None] | None:
        """The prompt log probabilities on a request's first output (streams) and on its final one."""
        gathered = self._prompt_logprobs.get(request_id)
        if gathered is None or not (finished or request_id not in self._prompt_logprobs_sent):
            return None
        self._prompt_logprobs_sent.add(request_id)
        return gathered

    def error_output(self, seq: Sequence, error: str, error_code: str | None = None) -> RequestOutput:
        """The last delta of a request the engine failed (``finish_reason`` "error")."""
        self.remove(seq.seq_id)
        return RequestOutput(
            request_id=seq.seq_id,
            new_token_ids=[],
            new_text="",
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            finished=True,
            finish_reason=SequenceStatus.FINISHED_ERROR.finish_reason,
            metrics=RequestMetrics.of(seq),
            error=error,
            error_code=error_code,
            token_ids=list(seq.output_token_ids),
            text="",
        )

    def _check_stop_strings(
        self, seq: Sequence, detok: IncrementalDetokenizer, delta: str, now: float
    ) -> None:
        """Finish ``seq`` if its text now contains a stop string; the text is cut there."""
        stops = seq.sampling_params.stop
        if not stops or not delta:
            return
        text = detok.text
        # Only the tail can hold a stop string that was not there before this delta.
        search_from = max(0, len(text) - len(delta) - max(len(s) for s in stops) + 1)
        hits = [(i, s) for s in stops if (i := text.find(s, search_from)) != -1]
        if not hits:
            return
        index, stop = min(hits)
        cut = index + len(stop) if seq.sampling_params.include_stop_str_in_output else index
        detok.text = text[:cut]
        self.scheduler.finish_sequence(seq, SequenceStatus.FINISHED_STOPPED, now, stop_reason=stop)


def stop_safe_end(text: str, stops: tuple[str, ...]) -> int:
    """Length of the prefix of ``text`` that no stop string can still claim.

    A tail of ``text`` that is a proper prefix of a stop string may become that stop string with the next
    tokens, so it is not streamed yet.
    """
    held = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:n]):
                held = n
                break
    return len(text) - held
