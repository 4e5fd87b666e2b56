"""The engine: requests in, one scheduled batch per step, tokens and finish status out."""

from __future__ import annotations

import collections
import json
import logging
import os
import time

import torch

from sarathi.config import DEFAULT_KV_CACHE_MEMORY_GIB, EngineConfig
from sarathi.core.block_manager import BlockManager
from sarathi.core.schedulers import make_scheduler
from sarathi.core.sequence import Sequence, SequenceStatus
from sarathi.engine.model_runner import ModelRunner
from sarathi.engine.sampler import SampledToken, Sampler
from sarathi.model import allocate_kv_cache, kv_cache_bytes_per_block, load_model
from sarathi.outputs import IterationStats, RequestMetrics, RequestOutput, TokenLogprob
from sarathi.sampling_params import SamplingParams
from sarathi.tokenizer import IncrementalDetokenizer, Tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_MAX_KEPT_STATS = 100_000
logger = logging.getLogger(__name__)


class LLMEngine:
    """Owns the model, the paged KV cache, the scheduler and the sampler; ``step()`` runs one iteration.

    Bad requests raise ``ValueError`` from ``add_request`` and leave every other request untouched.
    """

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        mc, cc = config.model, config.cache
        self.dtype = _DTYPES[mc.dtype]
        self.device = torch.device("cpu")
        self.model, self.arch, tokenizer_dir = load_model(
            mc.model,
            load_format=mc.load_format,
            dtype=self.dtype,
            compute_dtype=_DTYPES[mc.compute_dtype],
            hf_config=mc.hf_config,
            seed=mc.seed,
        )
        self.tokenizer = Tokenizer(tokenizer_dir) if tokenizer_dir else None
        self.max_model_len = self._resolve_max_model_len()
        self.num_kv_blocks = self._resolve_num_blocks()
        self.kv_caches = allocate_kv_cache(
            self.arch, self.num_kv_blocks, cc.block_size, self.dtype, self.device
        )
        self.block_manager = BlockManager(self.num_kv_blocks, cc.block_size, cc.watermark)
        self.scheduler = make_scheduler(config.scheduler, self.block_manager, self.max_model_len)
        self.runner = ModelRunner(self.model, self.kv_caches, self.block_manager, self.device)
        self.tokenizer_dir = tokenizer_dir
        self.eos_token_ids = self._eos_token_ids(tokenizer_dir)
        self.sampler = Sampler(mc.seed, self.eos_token_ids)
        self.stats: collections.deque[IterationStats] = collections.deque(maxlen=_MAX_KEPT_STATS)
        self._seqs: dict[str, Sequence] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._emitted_chars: dict[str, int] = {}
        self._iteration = 0

    # --- setup -------------------------------------------------------------------------------------------
    def _resolve_max_model_len(self) -> int:
        limit = self.arch.max_position_embeddings
        asked = self.config.model.max_model_len
        if asked is None:
            return limit
        if asked > limit:
            raise ValueError(f"max_model_len {asked} exceeds the model's max_position_embeddings {limit}")
        return asked

    def _eos_token_ids(self, folder: str | None) -> tuple[int, ...]:
        """EOS ids from config.json, generation_config.json (chat models often add end-of-turn ids there)
        and the tokenizer; any of them ends a request unless ``ignore_eos``."""
        ids = list(self.arch.eos_token_ids)
        gen_path = os.path.join(folder, "generation_config.json") if folder else None
        if gen_path and os.path.isfile(gen_path):
            with open(gen_path) as f:
                eos = json.load(f).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return tuple(dict.fromkeys(int(i) for i in ids))

    def _resolve_num_blocks(self) -> int:
        cc = self.config.cache
        if cc.num_kv_blocks is not None:
            return cc.num_kv_blocks
        gib = DEFAULT_KV_CACHE_MEMORY_GIB if cc.kv_cache_memory_gib is None else cc.kv_cache_memory_gib
        per_block = kv_cache_bytes_per_block(self.arch, cc.block_size, self.dtype)
        num_blocks = int(gib * 2**30) // per_block
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory_gib={gib} is smaller than one KV block ({per_block} bytes)")
        return num_blocks

    # --- requests ----------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        sampling_params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request (a text prompt or token ids). Raises ValueError naming the problem."""
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = sampling_params or SamplingParams()
        token_ids = self._prompt_token_ids(prompt)
        vocab = self.arch.vocab_size
        if bad := [t for t in params.stop_token_ids if t >= vocab]:
            raise ValueError(f"stop_token_ids must be token ids in [0, {vocab}), got {bad[:5]}")
        seq = Sequence(
            seq_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            max_model_len=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
        )
        self.scheduler.add_sequence(seq)
        self._seqs[request_id] = seq
        if self.tokenizer is not None:
            self._detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, token_ids)
            self._emitted_chars[request_id] = 0

    def _prompt_token_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompt token ids instead of text")
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt)
            vocab = self.arch.vocab_size
            bad = [
                t for t in token_ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
            ]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}), got {bad[:5]}")
        if not token_ids:
            raise ValueError("prompt is empty")
        return token_ids

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is; its KV blocks are freed. Unknown ids are ignored."""
        if request_id in self._seqs:
            self.scheduler.abort_sequence(request_id, time.monotonic())
            self._forget(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_iterations(self) -> int:
        """Iterations run so far (each appends one ``IterationStats`` to ``stats``)."""
        return self._iteration

    @property
    def num_unfinished_requests(self) -> int:
        return self.scheduler.num_waiting + self.scheduler.num_running

    # --- the loop ----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration; return an output for every request that got a token or finished.

        A failure while processing one request finishes that request with ``finish_reason`` "error" and
        leaves the others running; a failure of the whole batch (the model) fails that batch's requests.
        """
        start = time.monotonic()
        batch = self.scheduler.schedule(start)
        if batch.is_empty:
            return []
        sampling = [e for e in batch.entries if e.samples]
        try:
            logits = self.runner.execute(batch)
            params = [e.seq.sampling_params for e in sampling]
            results = self.sampler.sample(logits, params, [e.seq.num_output_tokens for e in sampling])
        except Exception as e:
            logger.exception("iteration %d failed; failing its %d requests", self._iteration, len(batch))
            message = f"the model failed on this request's batch: {type(e).__name__}: {e}"
            sampling = batch.entries
            results = [SampledToken(None, error=message)] * len(sampling)
        end = time.monotonic()
        outputs = [
            self._fail(e.seq, r.error, end) for e, r in zip(sampling, results, strict=True) if r.error
        ]
        new_tokens = {e.seq.seq_id: r.token_id for e, r in zip(sampling, results, strict=True) if not r.error}
        self.scheduler.finish_step(batch, new_tokens, end)
        for e, r in zip(sampling, results, strict=True):
            if r.error:
                continue
            try:
                outputs.append(self._emit(e.seq, r.token_id, end, r.logprob))
            except Exception as exc:
                logger.exception("output processing of %s failed", e.seq.seq_id)
                error = f"output processing failed: {type(exc).__name__}: {exc}"
                outputs.append(self._fail(e.seq, error, end))
        self._record_stats(batch, start, end)
        return outputs

    def _fail(self, seq: Sequence, error: str, now: float) -> RequestOutput:
        """Finish ``seq`` with an internal error; its blocks are freed and nothing else is touched."""
        self.scheduler.finish_sequence(seq, SequenceStatus.FINISHED_ERROR, now)
        if seq.status is not SequenceStatus.FINISHED_ERROR:  # it had just finished when its output failed
            seq.finish(SequenceStatus.FINISHED_ERROR, now)
        self._forget(seq.seq_id)
        return RequestOutput(
            request_id=seq.seq_id,
            prompt_token_ids=seq.prompt_token_ids,
            new_token_ids=[],
            new_text="",
            token_ids=list(seq.output_token_ids),
            text="",
            finished=True,
            finish_reason=seq.status.finish_reason,
            metrics=RequestMetrics.of(seq),
            error=error,
        )

    def _emit(
        self, seq: Sequence, token_id: int, now: float, logprob: TokenLogprob | None = None
    ) -> RequestOutput:
        detok = self._detokenizers.get(seq.seq_id)
        new_text = text = ""
        if detok is not None:
            delta = detok.add([token_id])
            if not seq.is_finished and seq.num_output_tokens > seq.sampling_params.min_tokens:
                self._check_stop_strings(seq, detok, delta, now)
            # Text that could still be the start of a stop string is held back until it is decided.
            end = len(detok.text) if seq.is_finished else _stop_safe_end(detok.text, seq.sampling_params.stop)
            start = self._emitted_chars[seq.seq_id]
            text, new_text = detok.text[:end], detok.text[start:end]
            self._emitted_chars[seq.seq_id] = max(start, end)
        output = RequestOutput(
            request_id=seq.seq_id,
            prompt_token_ids=seq.prompt_token_ids,
            new_token_ids=[token_id],
            new_text=new_text,
            token_ids=list(seq.output_token_ids),
            text=text,
            finished=seq.is_finished,
            finish_reason=seq.status.finish_reason,
            stop_reason=seq.stop_reason,
            metrics=RequestMetrics.of(seq),
            new_logprobs=None if logprob is None else [logprob],
        )
        if seq.is_finished:
            self._forget(seq.seq_id)
        return output

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

    def _forget(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)
        self._detokenizers.pop(request_id, None)
        self._emitted_chars.pop(request_id, None)

    def _record_stats(self, batch, start: float, end: float) -> None:
        self.stats.append(
            IterationStats(
                iteration=self._iteration,
                start_time=start,
                wall_time=end - start,
                num_prefill_tokens=batch.num_prefill_tokens,
                num_decode_tokens=batch.num_decode_tokens,
                num_seqs=batch.num_seqs,
                num_preempted=len(batch.preempted),
                num_running=self.scheduler.num_running,
                num_waiting=self.scheduler.num_waiting,
                num_used_blocks=self.block_manager.num_used_blocks,
                seq_ids=tuple(batch.seq_ids),
            )
        )
        self._iteration += 1


def _stop_safe_end(text: str, stops: tuple[str, ...]) -> int:
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
