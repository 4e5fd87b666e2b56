"""Offline batch inference: ``LLM(...).generate(prompts, params)`` and ``LLM(...).chat(messages)``."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence as Seq
from typing import Any

from tqdm.auto import tqdm

from sarathi.config import DEFAULT_TOKEN_BUDGET, EngineConfig, engine_config
from sarathi.engine.input_processor import EngineRequest, InputProcessor, InvalidRequestError
from sarathi.entrypoints.build import build_engine
from sarathi.outputs import RequestOutput
from sarathi.parallel_sampling import best_indices, child_params, cumulative_logprob
from sarathi.sampling_params import SamplingParams
from sarathi.structured_output import StructuredOutput, StructuredOutputLimits, check_compiles, llg_tokenizer
from sarathi.tokenizer import Tokenizer

Prompt = str | list[int]


class LLM:
    """A whole engine behind a simple call: give prompts, get finished outputs in the same order.

    ``model`` is a Hugging Face folder, a .gguf file, or None for the embedded SmolLM2-135M-Instruct.

    ``token_budget`` defaults to a fixed 64: offline generation has no reader waiting between tokens, so a
    TBT SLO means nothing here, and constructing an ``LLM`` must never start a minutes-long machine
    profile. ``token_budget="auto"`` (with ``tbt_slo`` seconds, default 5x this machine's one-sequence
    decode iteration) chooses it as ``sarathi serve`` does.
    """

    def __init__(
        self, model: str | None = None, *, config: EngineConfig | None = None, **kwargs: Any
    ) -> None:
        """Keyword arguments are those of ``sarathi.config.engine_config`` (scheduler, token_budget, dtype,
        max_num_seqs, num_kv_blocks, tensor_parallel_size, pipeline_parallel_size,
        distributed_executor_backend, ...); or pass a ready ``config``."""
        if config is not None and (model is not None or kwargs):
            raise ValueError("pass either config or model/keyword settings, not both")
        tbt_slo = kwargs.pop("tbt_slo", None)
        if kwargs.get("token_budget") == "auto":
            from sarathi.simulator.auto_budget import auto_token_budget

            base = engine_config(model, **{**kwargs, "token_budget": DEFAULT_TOKEN_BUDGET})
            kwargs["token_budget"] = auto_token_budget(base, tbt_slo)
        elif tbt_slo is not None:
            raise ValueError('tbt_slo is used only with token_budget="auto"')
        self.engine = build_engine(config or engine_config(model, **kwargs))
        self.structured_output_limits = StructuredOutputLimits()
        self._ids = itertools.count()
        self._llg_tokenizer = None
        self._compiled: set[StructuredOutput] = set()

    def shutdown(self) -> None:
        """Stop the engine's worker processes (if any); the LLM cannot generate afterwards."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def get_tokenizer(self) -> Tokenizer:
        if self.engine.tokenizer is None:
            raise ValueError("this model has no tokenizer")
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs come back in prompt order.

        If any prompt is invalid, nothing runs and InvalidRequestError (a ValueError) names the prompt's
        index and the problem.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        groups = self._add_all(prompts, params)
        finished = self._run([rid for group in groups for rid in group], use_tqdm)
        return [_choose(p, [finished[rid] for rid in group]) for p, group in zip(params, groups, strict=True)]

    def chat(
        self,
        messages: list[dict] | Seq[list[dict]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, using the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.get_tokenizer()
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    @property
    def input_processor(self) -> InputProcessor:
        """Checks each prompt and its params before the engine sees them; a structured output is held to
        ``structured_output_limits`` and compiled here (once per distinct constraint), so a bad one raises
        instead of failing its request in the worker."""
        e = self.engine
        return InputProcessor(e.model.vocab_size, e.tokenizer, self.structured_output_limits, self._compile)

    def _compile(self, constraint: StructuredOutput) -> None:
        if constraint not in self._compiled:
            if self._llg_tokenizer is None:
                e = self.engine
                self._llg_tokenizer = llg_tokenizer(
                    e.model.tokenizer_dir, e.model.vocab_size, e.eos_token_ids
                )
            check_compiles(self._llg_tokenizer, constraint)
            self._compiled.add(constraint)

    def _add_all(self, prompts: list[Prompt], params: list[SamplingParams]) -> list[list[str]]:
        """Check every prompt and add its sequences (``best_of`` or ``n`` of them); the request ids per
        prompt. If one is refused, none runs: InvalidRequestError names the prompt's index."""
        processor = self.input_processor
        added: list[str] = []
        groups = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            request_id = f"offline-{next(self._ids)}"
            children = child_params(p) if p.num_sequences > 1 else [p]
            ids = [request_id] if len(children) == 1 else [f"{request_id}-{j}" for j in range(len(children))]
            try:
                token_ids = processor.prompt_token_ids(prompt)
                processor.check_params(p)
                for j, (rid, child) in enumerate(zip(ids, children, strict=True)):
                    self.engine.add_request(rid, EngineRequest(token_ids, child), after=ids[0] if j else None)
                    added.append(rid)
            except ValueError as e:  # any refusal: none of this call's requests may stay queued
                for rid in added:
                    self.engine.abort_request(rid)
                param, code = getattr(e, "param", "prompt"), getattr(e, "code", None)
                raise InvalidRequestError(f"prompt {i}: {e}", param, code) from e
            groups.append(ids)
        return groups

    def _run(self, request_ids: list[str], use_tqdm: bool) -> dict[str, RequestOutput]:
        wanted = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(request_ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while len(finished) < len(request_ids):
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError("engine stopped with requests still unfinished")
                for out in self.engine.step().outputs:
                    if out.finished and out.request_id in wanted:
                        finished[out.request_id] = out
                        bar.update(1)
        return finished


def _choose(params: SamplingParams, outputs: list[RequestOutput]) -> RequestOutput:
    """A prompt's result: its one output, or its best ``n`` choices (the first also stands for the group)."""
    if len(outputs) == 1:
        return outputs[0]
    if params.num_sequences > params.n:
        keep = best_indices([cumulative_logprob(o.logprobs or ()) for o in outputs], params.n)
        outputs = [outputs[i] for i in keep]
        if params.logprobs is None:  # they were asked for only to rank the choices
            outputs = [dataclasses.replace(o, logprobs=None) for o in outputs]
    return dataclasses.replace(outputs[0], choices=tuple(outputs))
