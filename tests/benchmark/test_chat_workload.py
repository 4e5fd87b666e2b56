"""The multi-turn chat workload: conversation shapes, turn release after think time, and a tiny bench run."""

from __future__ import annotations

import json

import pytest

from sarathi.benchmark.chat_workload import ChatSession, ChatWorkloadConfig, generate_conversations
from sarathi.benchmark.workload import TokenSpace
from sarathi.entrypoints.cli import main

SPACE = TokenSpace(1000, frozenset({0, 1, 2}))


def test_conversations_share_the_system_prompt_and_respect_the_limits():
    config = ChatWorkloadConfig(
        num_conversations=20, min_turns=1, max_turns=5, system_prompt_len=50, max_total_tokens=300, qps=2.0
    )
    convs = generate_conversations(config, SPACE)
    assert convs == generate_conversations(config, SPACE), "one seed, one workload"
    assert len(convs) == 20 and len({c.system_token_ids for c in convs}) == 1
    assert [c.start_time for c in convs] == sorted(c.start_time for c in convs) and convs[0].start_time > 0
    for c in convs:
        assert len(c.system_token_ids) == 50 and len(c.turns) <= 5
        total = 50 + sum(len(t.user_token_ids) + t.num_output_tokens for t in c.turns)
        assert total <= 300
        for t in c.turns:
            assert 16 <= len(t.user_token_ids) <= 64 and 16 <= t.num_output_tokens <= 64 and t.think_time >= 0
            assert not {0, 1, 2} & set(t.user_token_ids)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="min_turns"):
        ChatWorkloadConfig(min_turns=3, max_turns=2)
    with pytest.raises(ValueError, match="max_total_tokens"):
        ChatWorkloadConfig(system_prompt_len=2000, max_total_tokens=2048)


def test_a_turn_arrives_after_the_previous_one_finished_and_resends_the_history():
    config = ChatWorkloadConfig(num_conversations=2, min_turns=2, max_turns=2, system_prompt_len=8, qps=None)
    convs = generate_conversations(config, SPACE)
    session = ChatSession(convs)
    assert session.num_requests == 4 and session.next_arrival() == 0.0
    first = session.pop_due(0.0)
    assert [r.request_id for r in first] == ["conv-0-turn0", "conv-1-turn0"]
    assert session.pop_due(100.0) == [] and session.next_arrival() is None and not session.done
    t0 = convs[0].turns[0]
    assert first[0].prompt_token_ids == convs[0].system_token_ids + t0.user_token_ids
    session.on_finish("conv-0-turn0", [5, 6, 7], now=10.0)
    t1 = convs[0].turns[1]
    assert session.next_arrival() == pytest.approx(10.0 + t1.think_time)
    (second,) = session.pop_due(10.0 + t1.think_time)
    assert second.prompt_token_ids == (*first[0].prompt_token_ids, 5, 6, 7, *t1.user_token_ids)
    assert second.arrival_time == pytest.approx(10.0 + t1.think_time)
    session.on_finish("conv-0-turn1", [1], now=20.0)
    session.on_finish("conv-1-turn0", [1], now=20.0)
    (last,) = session.pop_due(1e9)
    session.on_finish(last.request_id, [1], now=30.0)
    assert session.done


def test_bench_runs_the_chat_workload_and_reports_the_hit_rate(tmp_path):
    out = tmp_path / "chat"
    flags = ["bench", "--trace", "chat", "--conversations", "2", "--turns", "2", "--system-prompt-len", "40"]
    flags += ["--user-len", "8", "--output-len", "3", "--think-time", "0.01", "--qps", "0"]
    flags += ["--num-kv-blocks", "64", "--token-budget", "64", "--output-dir", str(out), "--no-progress"]
    assert main(flags) == 0
    (entry,) = json.loads((out / "summary.json").read_text())
    assert entry["trace"] == "chat" and entry["num_requests"] == 4 and entry["num_output_tokens"] == 12
    # Turn 2 of each conversation reuses its first 3 blocks (40 + 8 + 3 = 51 tokens, the last is computed);
    # the second conversation's first turn reuses the system prompt's 2 full blocks if it came later.
    assert entry["prefix_cache_hits"] >= 2 * 48 and 0 < entry["prefix_cache_hit_rate"] < 1
