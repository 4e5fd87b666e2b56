"""Turns a step's scheduled requests into flat tensors and runs the model: where Python becomes tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sarathi.engine.step_messages import StepInput
from sarathi.model import SeqSlice, build_attention_metadata
from sarathi.model.attention import AttentionMetadata


@dataclass
class RequestState:
    """A worker's own copy of one request: every token it knows and its KV block table of each group
    (entries a sliding-window group dropped are never read again; they stay as they were sent)."""

    token_ids: list[int]
    num_output_tokens: int
    sampling_params: object
    block_ids: list[list[int]]
    num_prompt_tokens: int = 0


@dataclass(frozen=True)
class PromptRows:
    """Rows of a prefill chunk whose logits score the prompt's next tokens: ``next_token_ids[i]`` is prompt
    token ``start + i``, predicted by the row before it."""

    request_id: str
    start: int
    next_token_ids: list[int]
    top_k: int


@dataclass(frozen=True)
class ModelInputs:
    """The flattened batch: token ids, positions, attention metadata (one per KV-cache group) and the rows
    that need logits (the sampling rows first, in order, then the ``prompt_rows``)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: tuple[AttentionMetadata, ...]
    logits_indices: torch.Tensor
    num_sampling_rows: int = 0
    prompt_rows: tuple[PromptRows, ...] = ()

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()


class ModelRunner:
    """Runs one step's tokens through the model (or this rank's shard of it) over the paged KV cache."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = torch.device(device)

    def prepare(self, step: StepInput, requests: dict[str, RequestState]) -> ModelInputs:
        """Flatten the step (no padding between requests) and map every new token to its KV slot."""
        input_ids: list[int] = []
        positions: list[int] = []
        starts: list[tuple[RequestState, int, int]] = []
        logits_indices: list[int] = []
        prompt_rows: list[PromptRows] = []
        prompt_indices: list[int] = []
        for s in step.scheduled:
            state = requests[s.request_id]
            end = s.start + s.num_tokens
            if end > len(state.token_ids):
                raise ValueError(
                    f"step {step.step_id}: {s.request_id!r} scheduled up to token {end}, "
                    f"but the worker knows {len(state.token_ids)}"
                )
            first_row = len(input_ids)
            input_ids.extend(state.token_ids[s.start : end])
            positions.extend(range(s.start, end))
            starts.append((state, s.start, s.num_tokens))
            if s.samples:
                logits_indices.append(len(input_ids) - 1)
            top_k = getattr(state.sampling_params, "prompt_logprobs", None)
            # Row p scores prompt token p + 1; rows of output tokens (after a preemption) score nothing.
            scored_end = min(end, state.num_prompt_tokens - 1)
            if top_k is not None and scored_end > s.start:
                next_ids = state.token_ids[s.start + 1 : scored_end + 1]
                prompt_rows.append(PromptRows(s.request_id, s.start + 1, next_ids, top_k))
                prompt_indices.extend(range(first_row, first_row + len(next_ids)))
        metadata = tuple(
            build_attention_metadata(
                [SeqSlice(state.block_ids[g], start, n) for state, start, n in starts],
                self.block_size,
                device=self.device,
            )
            for g in range(len(starts[0][0].block_ids))
        )
        return ModelInputs(
            torch.tensor(input_ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            metadata,
            torch.tensor(logits_indices + prompt_indices, dtype=torch.long, device=self.device),
            len(logits_indices),
            tuple(prompt_rows),
        )

    @torch.inference_mode()
    def run(self, inputs: ModelInputs, hidden_states: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits of the sampling rows (last stage), else the hidden states for the next stage."""
        return self.model(
            inputs.input_ids,
            inputs.positions,
            inputs.metadata,
            self.kv_caches,
            inputs.logits_indices,
            hidden_states=hidden_states,
        )
