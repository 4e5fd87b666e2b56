"""A worker: one rank's shard of the model, the KV cache of its layers and heads, and its request state.

The same class runs in the engine's process (one rank), in a worker process (``mp``) or in a Ray actor.
It only ever sees plain ``StepInput`` data; the last pipeline stage samples, where the logits are.
"""

from __future__ import annotations

import time

import torch

from sarathi.config import EngineConfig
from sarathi.engine.step_messages import SampledToken, StageTiming, StepInput, StepOutput
from sarathi.model import allocate_kv_cache, load_model
from sarathi.model.loader import effective_quantization, resolve_compute_dtype
from sarathi.model.parallel import WHOLE_MODEL, ParallelContext, ShardSpec, TensorParallelGroup
from sarathi.worker.grammar_masks import CONSTRAINT_FAILED, GrammarMasks
from sarathi.worker.model_runner import ModelRunner, RequestState
from sarathi.worker.prompt_logprobs import score_prompt_rows
from sarathi.worker.sampler import make_sampler

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# How long a step that runs no model waits for a matcher build to finish before answering: the engine
# sends such steps only while requests wait for their matchers, and should not spin.
_GRAMMAR_POLL_WAIT_S = 0.02


class Worker:
    """Executes steps on this rank: updates its request state, runs its layers, samples on the last stage."""

    def __init__(
        self,
        config: EngineConfig,
        num_kv_blocks: int,
        eos_token_ids: tuple[int, ...],
        shard: ShardSpec = WHOLE_MODEL,
        context: ParallelContext | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        mc = config.model
        self.shard = shard
        self.context = context or ParallelContext(shard, TensorParallelGroup())
        self.dtype = TORCH_DTYPES[mc.storage_dtype]
        self.model, self.arch, tokenizer_dir = load_model(
            mc.model,
            load_format=mc.load_format,
            dtype=self.dtype,
            compute_dtype=resolve_compute_dtype(self.dtype, mc.compute_dtype),
            quantization=effective_quantization(mc),
            hf_config=mc.hf_config,
            seed=mc.seed,
            shard=shard,
            tp_group=self.context.tp_group,
        )
        block_size = config.cache.block_size
        self.kv_caches = allocate_kv_cache(
            self.arch, num_kv_blocks, block_size, self.dtype, device, shard, shared_pages=True
        )
        self.runner = ModelRunner(self.model, self.kv_caches, block_size, device)
        self.sampler = make_sampler(mc.seed, eos_token_ids) if shard.is_last_stage else None
        self.grammars = (
            GrammarMasks(tokenizer_dir, self.arch.vocab_size, eos_token_ids) if shard.is_last_stage else None
        )
        self.requests: dict[str, RequestState] = {}

    def execute(self, step: StepInput) -> tuple[StepOutput | None, StageTiming]:
        """Run this rank's part of ``step``; the last stage returns the sampled tokens."""
        start = time.monotonic()
        self._update_requests(step)
        if not step.scheduled:
            return self._answer_grammar_poll(step, start)
        inputs = self.runner.prepare(step, self.requests)
        hidden = None
        if not self.shard.is_first_stage:
            hidden = self.context.recv_from_prev_stage(
                (inputs.num_tokens, self.arch.hidden_size), torch.float32
            )
            start = time.monotonic()  # waiting for the previous stage is a bubble, not work
        out = self.runner.run(inputs, hidden)
        if not self.shard.is_last_stage:
            self.context.send_to_next_stage(out)
            return None, StageTiming(step.step_id, self.shard.pp_rank, start, time.monotonic())
        sampling = [s for s in step.scheduled if s.samples]
        states = [self.requests[s.request_id] for s in sampling]
        params = [r.sampling_params for r in states]
        history = [r.token_ids for r in states] if any(p.penalized for p in params) else None
        request_ids = [s.request_id for s in sampling]
        prompt = score_prompt_rows(out[inputs.num_sampling_rows :], inputs.prompt_rows)
        out, failed = self.grammars.apply(out[: inputs.num_sampling_rows], request_ids)
        sampled = self.sampler.sample(out, params, [r.num_output_tokens for r in states], history)
        for i, error in failed.items():
            sampled[i] = SampledToken(None, error=error, error_code=CONSTRAINT_FAILED)
        self.grammars.advance(request_ids, sampled)
        ready, failed = self.grammars.poll()
        timing = StageTiming(step.step_id, self.shard.pp_rank, start, time.monotonic())
        return StepOutput(step.step_id, sampled, prompt, ready, failed), timing

    def _answer_grammar_poll(self, step: StepInput, start: float) -> tuple[StepOutput | None, StageTiming]:
        """A step with nothing scheduled: only the sampling stage answers, with the matchers' status."""
        output = None
        if self.shard.is_last_stage:
            ready, failed = self.grammars.poll(wait_s=0 if step.grammar_jobs else _GRAMMAR_POLL_WAIT_S)
            output = StepOutput(step.step_id, [], [], ready, failed)
        return output, StageTiming(step.step_id, self.shard.pp_rank, start, time.monotonic())

    def _update_requests(self, step: StepInput) -> None:
        if self.grammars is not None:
            for job in step.grammar_jobs:
                self.grammars.prepare(job.request_id, job.constraint)
        for request_id in step.freed_request_ids:
            self.requests.pop(request_id, None)
            if self.grammars is not None:
                self.grammars.remove(request_id)
        for r in step.new_requests:
            self.requests[r.request_id] = RequestState(
                r.prompt_token_ids + r.output_token_ids,
                len(r.output_token_ids),
                r.sampling_params,
                [_readable(t) for t in r.block_ids],
                len(r.prompt_token_ids),
            )
            if self.grammars is not None and r.sampling_params.structured_output is not None:
                self.grammars.add(r.request_id, r.sampling_params.structured_output, r.output_token_ids)
        for s in step.scheduled:
            state = self.requests[s.request_id]
            state.token_ids.extend(s.new_token_ids)
            state.num_output_tokens += len(s.new_token_ids)
            if s.new_block_ids:  # else nothing new in any group
                for table, new in zip(state.block_ids, s.new_block_ids, strict=True):
                    table.extend(_readable(new))


def _readable(block_ids: list[int]) -> list[int]:
    """A table whose dropped entries (NULL_BLOCK, outside every window) point at block 0: attention never
    reads them, but index tensors must hold valid block ids."""
    return [max(b, 0) for b in block_ids]
