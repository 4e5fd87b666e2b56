"""The engine: requests in, scheduled micro-batches out to an executor, tokens and finish status back."""

from __future__ import annotations

import collections
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sarathi.config import EngineConfig
from sarathi.core.batch import Batch
from sarathi.core.block_manager import BlockManager
from sarathi.core.schedulers import make_scheduler, max_step_tokens
from sarathi.core.schedulers.base import BudgetController
from sarathi.core.sequence import Sequence, SequenceStatus
from sarathi.engine.core_messages import EngineSnapshot
from sarathi.engine.executor_base import Executor, WorkerFailedError
from sarathi.engine.input_processor import EngineRequest, InputProcessor
from sarathi.engine.model_info import ModelInfo
from sarathi.engine.output_processor import OutputProcessor
from sarathi.engine.step_builder import StepBuilder
from sarathi.engine.step_messages import SampledToken, StageTiming
from sarathi.outputs import IterationStats, RequestOutput
from sarathi.sampling_params import InvalidRequestError, SamplingParams
from sarathi.tokenizer import Tokenizer

_MAX_KEPT_STATS = 100_000
logger = logging.getLogger(__name__)


@dataclass
class _InFlight:
    batch: Batch
    step_id: int
    start: float


@dataclass
class StepResult:
    """What one ``step()`` did: an output for every request that got a token or finished, and the
    iteration it completed (None when it only polled for structured-output matchers)."""

    outputs: list[RequestOutput] = field(default_factory=list)
    iteration: IterationStats | None = None


class LLMEngine:
    """Owns the scheduler, the KV block bookkeeping and an executor whose workers hold the model.

    ``step()`` runs one iteration: it keeps up to ``pipeline_parallel_size`` micro-batches in flight
    and returns the outputs of the oldest. Bad requests raise ``ValueError`` from ``add_request`` and
    leave every other request untouched.

    The engine is assembled by its builder (``sarathi.executor.assemble``), which reads ``model`` from the
    checkpoint, sizes the KV pool (``num_kv_blocks``) and passes ``executor_factory`` (called last, with
    the config, the pool size and the EOS ids, once everything else is valid). ``clock`` stamps arrivals,
    schedules and tokens; ``budget_controller`` sets each iteration's token budget (the adaptive budget).
    The simulator passes a simulated clock and an executor that charges a latency model.
    """

    def __init__(
        self,
        config: EngineConfig,
        model: ModelInfo,
        *,
        tokenizer: Tokenizer | None,
        num_kv_blocks: int,
        executor_factory: Callable[[EngineConfig, int, tuple[int, ...]], Executor],
        budget_controller: BudgetController | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.model = model
        self.clock = clock
        cc = config.cache
        if config.scheduler.adaptive_tbt_slo is not None and budget_controller is None:
            raise ValueError("adaptive_tbt_slo needs a budget controller from the engine's builder")
        self.tokenizer = tokenizer
        self.num_kv_blocks = num_kv_blocks
        self.eos_token_ids = model.eos_token_ids
        self.block_manager = BlockManager(
            num_kv_blocks,
            cc.block_size,
            cc.watermark,
            enable_caching=cc.enable_prefix_caching,
            group_windows=model.kv_group_windows,
            max_step_tokens=max_step_tokens(config.scheduler),
        )
        self.max_model_len = self._resolve_max_model_len()
        self.scheduler = make_scheduler(config.scheduler, self.block_manager, self.max_model_len)
        self.scheduler.budget_controller = budget_controller
        self.step_builder = StepBuilder(self.block_manager)
        self.outputs = OutputProcessor(self.tokenizer, self.scheduler)
        self.stats: collections.deque[IterationStats] = collections.deque(maxlen=_MAX_KEPT_STATS)
        self._stage_timings: collections.deque[StageTiming] = collections.deque(maxlen=_MAX_KEPT_STATS)
        self._seqs: dict[str, Sequence] = {}
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._held: dict[str, list[Sequence]] = {}  # parent request id -> requests waiting for its prefill
        # Constrained requests waiting for their matcher (built by the sampling worker), with their parent.
        self._compiling: dict[str, tuple[Sequence, str | None]] = {}
        self._iteration = 0
        self.executor = executor_factory(config, num_kv_blocks, self.eos_token_ids)

    # --- setup -------------------------------------------------------------------------------------------
    def _resolve_max_model_len(self) -> int:
        """The model's context length, or ``max_model_len``; capped to what the KV cache can hold when
        not given, refused (naming both numbers and the flags) when given and too large."""
        limit = self.model.max_position_embeddings
        asked = self.config.model.max_model_len
        if asked is not None and asked > limit:
            raise ValueError(f"max_model_len {asked} exceeds the model's max_position_embeddings {limit}")
        bm = self.block_manager
        capacity = bm.max_tokens_in_empty_cache(limit)
        if asked is None:
            if capacity < limit:
                logger.warning(
                    "the KV cache holds %d tokens, fewer than the model's context of %d: max_model_len is %d "
                    "(raise --num-kv-blocks / --kv-cache-memory for more)",
                    capacity,
                    limit,
                    capacity,
                )
            return min(limit, capacity)
        if asked > capacity:
            raise ValueError(
                f"max_model_len {asked} does not fit the KV cache, which holds {capacity} tokens "
                f"({bm.num_blocks} blocks of {bm.block_size}); lower --max-model-len or raise "
                "--num-kv-blocks / --kv-cache-memory"
            )
        return asked

    # --- requests ----------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | EngineRequest,
        sampling_params: SamplingParams | None = None,
        arrival_time: float | None = None,
        after: str | None = None,
    ) -> None:
        """Queue a request: an ``EngineRequest`` (checked by an ``InputProcessor``), or a text prompt or
        token ids with ``sampling_params``, checked here by ``input_processor``. Raises
        ``InvalidRequestError`` (a ValueError) naming the problem.

        ``after`` names a request whose prompt this one shares (a sibling choice of ``n``): this one waits
        until that one has its first token, so with prefix caching it reads the prompt's KV blocks instead
        of computing them again. Its arrival time (and so its TTFT) includes the wait.
        """
        if request_id in self._seqs:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if not isinstance(prompt, EngineRequest):
            prompt = self.input_processor.process(prompt, sampling_params or SamplingParams())
        params = prompt.sampling_params
        seq = Sequence(
            seq_id=request_id,
            prompt_token_ids=prompt.prompt_token_ids,
            sampling_params=params,
            arrival_time=self.clock() if arrival_time is None else arrival_time,
            max_model_len=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
        )
        if params.structured_output is None:
            self._admit(seq, after)  # the scheduler refuses a request it could never serve
        else:  # its matcher compiles in the background; the request is scheduled once it is ready
            self._compiling[request_id] = (seq, after)
            self.step_builder.prepare_grammar(request_id, params.structured_output)
        self._seqs[request_id] = seq
        self.outputs.add_request(seq)

    @functools.cached_property
    def input_processor(self) -> InputProcessor:
        """Checks raw requests; a structured output compiles only as the worker's matcher (or fails there)."""
        return InputProcessor(self.model.vocab_size, self.tokenizer)

    def _admit(self, seq: Sequence, after: str | None) -> None:
        """Hand ``seq`` to the scheduler, or hold it until its parent (``after``) has a token."""
        parent = self._seqs.get(after) if after is not None else None
        if parent is not None and parent.num_output_tokens == 0 and self.block_manager.enable_caching:
            self._held.setdefault(after, []).append(seq)
        else:
            self.scheduler.add_sequence(seq)

    def _grammar_outputs(self, ready: list[str], failed: list[tuple[str, str]]) -> list[RequestOutput]:
        """Admit the waiting requests whose matcher is ready; fail those whose matcher did not build."""
        for request_id in ready:
            if (waiting := self._compiling.pop(request_id, None)) is not None:
                self._admit(*waiting)
        outputs = []
        for request_id, error in failed:
            if (waiting := self._compiling.pop(request_id, None)) is not None:
                seq = waiting[0]
                seq.finish(SequenceStatus.FINISHED_ERROR, self.clock())
                self._forget(request_id)
                error = f"structured output: {error}"
                outputs.append(self.outputs.error_output(seq, error, "invalid_structured_output"))
        return outputs

    def _poll_grammars(self) -> list[RequestOutput]:
        """With nothing to run, send the workers a step without a batch: it carries the new grammar jobs
        and comes back with the matchers that are ready (the worker waits a little for one)."""
        step = self.step_builder.build(Batch())
        self.executor.submit(step)
        output = self.executor.collect()
        return self._grammar_outputs(output.grammars_ready, output.grammar_errors)

    def _release_held(self, parent_id: str) -> None:
        """Queue the requests that waited for ``parent_id``'s prefill (it has a token, finished or left)."""
        for seq in self._held.pop(parent_id, ()):
            self.scheduler.add_sequence(seq)

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is (also while in flight); its KV blocks are freed. Unknown ids
        are ignored."""
        if request_id in self._compiling:
            del self._compiling[request_id]
            self._forget(request_id)
        elif request_id in self._seqs:
            held = next((h for h in self._held.values() if any(s.seq_id == request_id for s in h)), None)
            if held is not None:
                held[:] = [s for s in held if s.seq_id != request_id]
            else:
                self.scheduler.abort_sequence(request_id, self.clock())
            self._forget(request_id)

    def snapshot(self) -> EngineSnapshot:
        """The queues and the KV pool, as the server's metrics report them."""
        scheduler, blocks = self.scheduler, self.block_manager
        return EngineSnapshot(
            num_waiting=scheduler.num_waiting,
            num_running=scheduler.num_running,
            num_preempted=sum(s.status is SequenceStatus.PREEMPTED for s in scheduler.waiting),
            num_kv_blocks_used=blocks.num_used_blocks,
            num_kv_blocks_total=blocks.num_blocks,
        )

    @property
    def num_waiting(self) -> int:
        """Requests queued for their first schedule (or preempted), not counting those held back."""
        return self.scheduler.num_waiting

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the executor's workers (empty for in-process workers)."""
        return self.executor.worker_pids

    def check_health(self) -> None:
        """Raise ``WorkerFailedError`` if a worker died (even while nothing is scheduled)."""
        self.executor.check_health()

    def has_unfinished_requests(self) -> bool:
        waiting = bool(self._held) or bool(self._compiling)
        return self.scheduler.has_unfinished() or bool(self._in_flight) or waiting

    @property
    def num_unfinished_requests(self) -> int:
        held = sum(map(len, self._held.values())) + len(self._compiling)
        return self.scheduler.num_waiting + self.scheduler.num_running + held

    # --- the loop ----------------------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Run one iteration: the outputs of every request that got a token or finished, and its stats.

        Fills the pipeline with micro-batches, then completes the oldest. A failure while processing
        one request finishes that request with ``finish_reason`` "error" and leaves the others running;
        a failed step (the model raised) fails that step's requests. A dead or hung worker raises
        ``WorkerFailedError``: the engine cannot go on.
        """
        while len(self._in_flight) < self.executor.max_in_flight:
            start = self.clock()
            batch = self.scheduler.schedule(start)
            if batch.is_empty:
                break
            step = self.step_builder.build(batch)
            self.executor.submit(step)
            self._in_flight.append(_InFlight(batch, step.step_id, start))
        if not self._in_flight:
            return StepResult(self._poll_grammars() if self._compiling else [])
        flight = self._in_flight.popleft()
        batch = flight.batch
        sampling = [e for e in batch.entries if e.samples]
        outputs = []
        try:
            step_output = self.executor.collect()
            results = step_output.sampled
            self.outputs.add_prompt_logprobs(step_output.prompt_logprobs)
            outputs = self._grammar_outputs(step_output.grammars_ready, step_output.grammar_errors)
        except WorkerFailedError:
            raise
        except Exception as e:
            logger.exception("iteration %d failed; failing its %d requests", self._iteration, len(batch))
            message = f"the model failed on this request's batch: {type(e).__name__}: {e}"
            sampling = batch.entries
            results = [SampledToken(None, error=message)] * len(sampling)
        end = self.clock()
        self._stage_timings.extend(self.executor.drain_timings())
        for e, r in zip(sampling, results, strict=True):
            if r.error and not e.seq.is_finished:
                outputs.append(self._fail(e.seq, r.error, end, r.error_code))
        new_tokens = {e.seq.seq_id: r.token_id for e, r in zip(sampling, results, strict=True) if not r.error}
        live = [
            (e, r) for e, r in zip(sampling, results, strict=True) if not r.error and not e.seq.is_finished
        ]
        for seq in self.scheduler.finish_step(batch, new_tokens, end):
            self.step_builder.free(seq.seq_id)
        for e, r in live:
            try:
                outputs.append(self.outputs.token_output(e.seq, r.token_id, end, r.logprob))
            except Exception as exc:
                logger.exception("output processing of %s failed", e.seq.seq_id)
                error = f"output processing failed: {type(exc).__name__}: {exc}"
                outputs.append(self._fail(e.seq, error, end))
            if e.seq.is_finished:
                self._forget(e.seq.seq_id)
            elif e.seq.seq_id in self._held:
                self._release_held(e.seq.seq_id)
        return StepResult(outputs, self._record_stats(flight, end))

    def _fail(self, seq: Sequence, error: str, now: float, error_code: str | None = None) -> RequestOutput:
        """Finish ``seq`` with an internal error; its blocks are freed and nothing else is touched."""
        self.scheduler.finish_sequence(seq, SequenceStatus.FINISHED_ERROR, now)
        if seq.status is not SequenceStatus.FINISHED_ERROR:  # it had just finished when its output failed
            seq.finish(SequenceStatus.FINISHED_ERROR, now)
        self._forget(seq.seq_id)
        return self.outputs.error_output(seq, error, error_code)

    def _forget(self, request_id: str) -> None:
        self._release_held(request_id)
        self._seqs.pop(request_id, None)
        self.outputs.remove(request_id)
        self.step_builder.free(request_id)

    def _record_stats(self, flight: _InFlight, end: float) -> IterationStats:
        batch = flight.batch
        stats = IterationStats(
            iteration=self._iteration,
            start_time=flight.start,
            wall_time=end - flight.start,
            num_prefill_tokens=batch.num_prefill_tokens,
            num_decode_tokens=batch.num_decode_tokens,
            num_seqs=batch.num_seqs,
            num_preempted=len(batch.preempted),
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_used_blocks=self.block_manager.num_used_blocks,
            prefix_cache_queries=batch.prefix_cache_queries,
            prefix_cache_hits=batch.prefix_cache_hits,
            seq_ids=tuple(batch.seq_ids),
            step_id=flight.step_id,
        )
        self.stats.append(stats)
        self._iteration += 1
        return stats

    def take_stage_timings(self) -> list[StageTiming]:
        """Each pipeline stage's start and end of the micro-batches completed since the last call."""
        timings = list(self._stage_timings)
        self._stage_timings.clear()
        return timings

    def shutdown(self) -> None:
        """Stop the executor's workers (worker processes or actors); safe to call twice."""
        self.executor.shutdown()
