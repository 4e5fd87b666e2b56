"""Multi-turn chat workload: conversations that resend their whole history every turn.

Every conversation starts with the same system prompt; turn ``k``'s prompt is the system prompt, then
each earlier turn's user message and the model's actual answer, then turn ``k``'s user message. A turn
arrives ``think_time`` seconds (exponential, a given mean) after the previous turn of its conversation
finished, so the turns of one conversation never overlap. Conversations start as a Poisson process of
``qps`` conversations per second. This is the traffic a prefix cache is for.

Only the in-process runner can replay it: the next prompt holds the previous answer's exact token ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sarathi.benchmark.workload import BenchRequest, TokenSpace, arrival_times


@dataclass(frozen=True)
class ChatWorkloadConfig:
    """Conversations, their shape (token counts drawn uniformly in [min, max]) and their timing."""

    num_conversations: int = 16
    min_turns: int = 2
    max_turns: int = 6
    system_prompt_len: int = 256
    user_min: int = 16
    user_max: int = 64
    output_min: int = 16
    output_max: int = 64
    think_time: float = 2.0
    qps: float | None = 0.5
    max_total_tokens: int | None = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_conversations < 1:
            raise ValueError(f"num_conversations must be >= 1, got {self.num_conversations}")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns}, {self.max_turns}")
        if self.system_prompt_len < 0:
            raise ValueError(f"system_prompt_len must be >= 0, got {self.system_prompt_len}")
        if not 1 <= self.user_min <= self.user_max:
            raise ValueError(f"need 1 <= user_min <= user_max, got {self.user_min}, {self.user_max}")
        if not 1 <= self.output_min <= self.output_max:
            raise ValueError(f"need 1 <= output_min <= output_max, got {self.output_min}, {self.output_max}")
        if not (self.think_time >= 0 and math.isfinite(self.think_time)):
            raise ValueError(f"think_time must be >= 0 seconds, got {self.think_time}")
        if self.qps is not None and not (self.qps > 0 and math.isfinite(self.qps)):
            raise ValueError(f"qps must be a positive number, got {self.qps}")
        first_turn = self.system_prompt_len + self.user_max + self.output_max
        if self.max_total_tokens is not None and self.max_total_tokens < first_turn:
            raise ValueError(
                f"max_total_tokens={self.max_total_tokens} cannot hold a first turn of up to {first_turn} "
                "tokens (system prompt + user + output)"
            )


@dataclass(frozen=True)
class ChatTurn:
    """One user message, the answer length asked for, and the pause before it is sent."""

    user_token_ids: tuple[int, ...]
    num_output_tokens: int
    think_time: float  # after the previous turn finished (unused for the first turn)


@dataclass(frozen=True)
class Conversation:
    """A conversation: when its first turn arrives (seconds after the start) and its turns."""

    conversation_id: str
    start_time: float
    system_token_ids: tuple[int, ...]
    turns: tuple[ChatTurn, ...]


def generate_conversations(config: ChatWorkloadConfig, token_space: TokenSpace) -> list[Conversation]:
    """The conversations of ``config``, by start time; a conversation stops before a turn whose prompt plus
    answer would exceed ``max_total_tokens``."""
    rng = np.random.default_rng(config.seed)
    allowed = token_space.allowed()
    if len(allowed) == 0:
        raise ValueError("the token space allows no token ids")

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(int(x) for x in allowed[rng.integers(0, len(allowed), size=n)])

    system = tokens(config.system_prompt_len)
    starts = arrival_times(config.num_conversations, "poisson", config.qps, 1.0, rng)
    conversations = []
    for c, start in enumerate(starts):
        turns, total = [], len(system)
        for _ in range(int(rng.integers(config.min_turns, config.max_turns + 1))):
            user = tokens(int(rng.integers(config.user_min, config.user_max + 1)))
            out = int(rng.integers(config.output_min, config.output_max + 1))
            think = float(rng.exponential(config.think_time)) if config.think_time > 0 else 0.0
            if config.max_total_tokens is not None and total + len(user) + out > config.max_total_tokens:
                break
            turns.append(ChatTurn(user, out, think))
            total += len(user) + out
        conversations.append(Conversation(f"conv-{c}", start, system, tuple(turns)))
    return conversations


class ChatSession:
    """Releases the turns of ``conversations`` as a runner reports finished turns.

    ``pop_due(now)`` returns the turns whose arrival time (seconds after the start) has passed, as
    ``BenchRequest``s with their full prompt; ``on_finish`` records a turn's answer and schedules the
    conversation's next turn. Request ids are ``<conversation>-turn<k>``.
    """

    def __init__(self, conversations: list[Conversation]) -> None:
        self._conversations = {c.conversation_id: c for c in conversations}
        self._history = {c.conversation_id: list(c.system_token_ids) for c in conversations}
        self._next_turn = dict.fromkeys(self._conversations, 0)
        # Conversations whose next turn has an arrival time, with that time.
        self._ready = {c.conversation_id: c.start_time for c in conversations if c.turns}
        self._in_progress: dict[str, str] = {}  # request id -> conversation id
        self.num_requests = sum(len(c.turns) for c in conversations)

    @property
    def done(self) -> bool:
        """Every turn was released and has finished."""
        return not self._ready and not self._in_progress

    def next_arrival(self) -> float | None:
        """The earliest arrival time of a turn not released yet, or None while none is known."""
        return min(self._ready.values(), default=None)

    def pop_due(self, now: float) -> list[BenchRequest]:
        due = sorted((t, cid) for cid, t in self._ready.items() if t <= now)
        requests = []
        for t, cid in due:
            del self._ready[cid]
            k = self._next_turn[cid]
            turn = self._conversations[cid].turns[k]
            prompt = tuple(self._history[cid]) + turn.user_token_ids
            request_id = f"{cid}-turn{k}"
            self._in_progress[request_id] = cid
            requests.append(BenchRequest(request_id, t, len(prompt), turn.num_output_tokens, prompt))
        return requests

    def on_finish(self, request_id: str, output_token_ids: list[int], now: float) -> None:
        """The turn ``request_id`` finished at ``now`` (seconds after the start) with this answer."""
        cid = self._in_progress.pop(request_id)
        k = self._next_turn[cid]
        turns = self._conversations[cid].turns
        self._history[cid] += [*turns[k].user_token_ids, *output_token_ids]
        self._next_turn[cid] = k + 1
        if k + 1 < len(turns):
            self._ready[cid] = now + turns[k + 1].think_time
