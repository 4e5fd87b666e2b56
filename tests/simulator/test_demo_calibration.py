"""The demo's promise on every kept machine profile, in simulation: at the load the demo calibrates,
sarathi's P99 TBT is at least 3x lower than vllm's, throughput at most 5% below and P99 TTFT within 1.5x, and
the whole demo (profile included) fits in 5 minutes. A regression on another kind of CPU fails here."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from benchmarks.demo_plan import (
    DEMO_SEARCH,
    SCHEDULERS,
    SLO_MULTIPLES,
    DemoSettings,
    broken_promises,
    plan_demo,
    plan_from_choice,
    predicted_wall_seconds,
    simulate_demo,
)
from sarathi.simulator.auto_budget import choose_token_budget, one_sequence_decode_s
from sarathi.simulator.machine_profile import predicted_profile_seconds
from sarathi.simulator.measured import MeasuredLatencyModel

PROFILES = sorted((Path(__file__).parents[1] / "data" / "latency-profiles").glob("*.json"))
DEMO_BOUND_S = 300.0
PROFILE_BOUND_S = 150.0
# Kept profiles of CPUs slower than the three kinds the 5-minute promise names (Zen4, Zen5, a Xeon without
# AVX512-BF16), with the bounds they are held to instead: a 2-core Zen3 has neither AVX-512 nor bf16, and its
# float32 FMA rate (~130 GFLOP/s) makes the one-time profile ~150 s and the four runs ~4.5 min (measured
# 4:37 for `python -m benchmarks.demo` with the profile cached).
SLOWER_MACHINE_BOUNDS_S = {"amd-epyc-zen3-family25-model1-q4_1-grid2": (160.0, 480.0)}


@functools.cache
def planned(profile: Path):
    """A kept profile's model and the demo's plan on it (the plan takes seconds of simulation: made once)."""
    model = MeasuredLatencyModel.load(profile)
    return model, plan_demo(DemoSettings(), model, profile=profile.name)


# `make test-all` only: the first grid's Zen4 profile, superseded by the same machine's grid-2 profile, and
# the Zen5's grid-3 profile of d71a230's kernels, superseded by the same machine's of 7e2d0ad's (~40 s of the
# suite on a Zen3).
SLOW_PROFILES = ("amd-epyc-zen4-family25-model17-bf16", "amd-epyc-zen5-family26-model2-q4_1-grid3")


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW_PROFILES else [])
        for p in PROFILES
    ],
)
def calibrated(request):
    model, plan = planned(request.param)
    return model, plan, simulate_demo(plan, model)


def test_profiles_are_kept():
    assert PROFILES, "tests/data/latency-profiles/ holds no profile"


def test_the_calibrated_budget_meets_the_strict_slo_or_says_why_not(calibrated):
    """The paper's strict SLO where the demo keeps its promises there (the Zen4s); else the next of 10x, 15x
    and the relaxed 25x at which it does (the Zen5: budget 16 at the strict SLO, TTFT P99 ~2.5x vllm's; the
    Zen3: no budget meets the strict SLO), and the SLO's reason says why the tighter ones were passed over."""
    model, plan, runs = calibrated
    assert plan.choice.meets_slo, plan.describe()
    assert plan.choice.mixed_iteration_s <= plan.choice.tbt_slo_s
    assert runs["sarathi"]["tbt_p99"] <= plan.choice.tbt_slo_s
    assert plan.qps > 0.05
    text = plan.describe()  # what the demo prints: machine, SLO, budget and load, each with its reason
    assert text.startswith("machine: ") and "held-out error" in text
    decode = one_sequence_decode_s(model)
    multiple = plan.choice.tbt_slo_s / decode
    assert any(multiple == pytest.approx(m) for m in SLO_MULTIPLES), multiple
    if multiple == pytest.approx(5):
        assert f"SLO: P99 TBT <= {plan.choice.tbt_slo_s * 1e3:.0f} ms (default: 5x" in text
    else:
        assert (
            f"SLO: P99 TBT <= {plan.choice.tbt_slo_s * 1e3:.0f} ms ({multiple:.0f}x the one-sequence decode"
            in text
        )
        assert "the paper's strict SLO, 5x" in text
        settings = plan.settings
        config, workload = settings.engine_config(), settings.workload()
        for tighter in [m for m in SLO_MULTIPLES if m < multiple - 1e-6]:
            made = choose_token_budget(config, model, tighter * decode, "", workload, search=DEMO_SEARCH)
            if made.meets_slo:  # a budget meets it, but the demo would break a promise there
                assert broken_promises(
                    simulate_demo(plan_from_choice(settings, made, model), model, SCHEDULERS[:2])
                )
    assert f"token budget: {plan.choice.token_budget} (chosen as --token-budget auto does" in text
    assert f"load: {plan.qps:g} QPS = {plan.load_fraction:.0%} of sarathi's simulated capacity" in text


def test_sarathi_separates_from_vllm_at_the_calibrated_load(calibrated):
    _, plan, runs = calibrated
    sarathi, vllm = runs["sarathi"], runs["vllm"]
    for name, s in runs.items():
        assert s["num_finished"] == plan.settings.num_requests, name
    assert vllm["tbt_p99"] >= 3 * sarathi["tbt_p99"], (plan.describe(), sarathi["tbt_p99"], vllm["tbt_p99"])
    assert runs["orca"]["tbt_p99"] >= 3 * sarathi["tbt_p99"]
    tput, vllm_tput = sarathi["throughput_tokens_per_s"], vllm["throughput_tokens_per_s"]
    assert tput >= 0.95 * vllm_tput  # at most 5% below (above it where vllm falls behind the load)
    assert sarathi["ttft_p99"] <= 1.5 * vllm["ttft_p99"]
    # faster_transformer never mixes prompts into a running batch: requests wait to be scheduled.
    assert runs["faster_transformer"]["scheduling_delay_p50"] > sarathi["scheduling_delay_p50"]


def test_the_demo_fits_in_five_minutes_with_its_profile(calibrated, request):
    model, _, runs = calibrated
    profile_bound, demo_bound = SLOWER_MACHINE_BOUNDS_S.get(
        request.node.callspec.id, (PROFILE_BOUND_S, DEMO_BOUND_S)
    )
    profile_s = predicted_profile_seconds(model, max_model_len=8192)
    assert profile_s <= profile_bound
    assert predicted_wall_seconds(runs, profile_s) <= demo_bound


def test_the_demo_script_prints_its_choices_and_runs_bench_with_them(tmp_path, monkeypatch, capsys):
    import sys

    from benchmarks import demo
    from sarathi.simulator import auto_budget, machine_profile

    kept = PROFILES[0]
    monkeypatch.setenv(machine_profile.PROFILE_ENV, str(kept))
    monkeypatch.setattr(auto_budget, "choice_cache_dir", lambda: tmp_path)
    argv = []
    monkeypatch.setattr(demo, "sarathi_main", lambda a: argv.extend(a) or 0)
    monkeypatch.setattr(sys, "argv", ["python -m benchmarks.demo"])
    assert demo.main() == 0
    err = capsys.readouterr().err
    _, plan = planned(kept)  # what the tests above check, chosen the way --token-budget auto does
    assert argv[:1] == ["bench"]
    assert argv[argv.index("--token-budget") + 1] == str(plan.choice.token_budget)
    assert float(argv[argv.index("--qps") + 1]) == plan.qps
    for line in ("machine: ", "SLO: P99 TBT <= ", "token budget: ", "load: ", "predicted P99 TBT"):
        assert line in err


def test_where_no_budget_meets_the_strict_slo_the_demo_takes_a_looser_one_and_says_so():
    """A CPU whose prefill is slow beside its decode (a Zen3 with the AVX2 decode kernels: 11 ms decodes,
    64 ms for the smallest mixed iteration) has no budget for the strict SLO: capacity 0 there, so the demo
    takes a looser one and says why (here the strict SLO is forced out of reach)."""
    from benchmarks.demo_plan import demo_plan_for
    from sarathi.simulator.auto_budget import default_tbt_slo

    zen4 = PROFILES[0].parent / "amd-epyc-zen4-family25-model17-bf16-grid2.json"  # strict SLO reachable
    model, settings = MeasuredLatencyModel.load(zen4), DemoSettings()
    decode = one_sequence_decode_s(model)

    def choose(slo: float | None, reason: str):
        config, workload = settings.engine_config(), settings.workload()
        if slo is None:  # the strict SLO, made unreachable
            slo, reason = 0.5 * decode, default_tbt_slo(model)[1]
        return choose_token_budget(config, model, slo, reason, workload, search=DEMO_SEARCH)

    plan = demo_plan_for(settings, model, choose)
    choice = plan.choice
    looser = [pytest.approx(m * decode) for m in SLO_MULTIPLES[1:]]
    assert choice.meets_slo and choice.tbt_slo_s in looser
    assert choice.mixed_iteration_s <= choice.tbt_slo_s and choice.capacity_qps > 0
    assert choice.slo_reason.startswith(f"{choice.tbt_slo_s / decode:.0f}x the one-sequence decode iteration")
    assert "no budget meets the paper's strict SLO, 5x" in choice.slo_reason
    assert not broken_promises(simulate_demo(plan, model, SCHEDULERS[:2]))


def test_broken_promises_name_each_promise_a_run_breaks():
    def runs(tbt, ttft, tput):
        sarathi = {"tbt_p99": 0.02, "ttft_p99": 1.0, "throughput_tokens_per_s": 100.0}
        vllm = {"tbt_p99": tbt, "ttft_p99": ttft, "throughput_tokens_per_s": tput}
        return {"sarathi": sarathi, "vllm": vllm}

    assert broken_promises(runs(0.06, 1.0, 100.0)) == []
    separation, ttft, tput = broken_promises(runs(0.05, 0.5, 110.0))
    assert "P99 TBT only 2.5x below vllm's" in separation
    assert "TTFT P99 at 2.00x vllm's" in ttft
    assert "throughput -9% from vllm's" in tput


def test_where_no_slo_keeps_every_promise_the_demo_takes_the_one_that_breaks_fewest(monkeypatch):
    """Without the 15x step, the Zen5 profile of commit 7e2d0ad keeps every promise at no SLO: 5x and 10x
    break the TTFT and throughput promises, 25x only the TTFT one (1.66x vllm's). The demo takes 25x then,
    not the tightest, and says what breaks."""
    from benchmarks import demo_plan

    zen5 = PROFILES[0].parent / "amd-epyc-zen5-family26-model2-q4_1-grid3-7e2d0ad.json"
    model = MeasuredLatencyModel.load(zen5)
    monkeypatch.setattr(demo_plan, "SLO_MULTIPLES", (5.0, 10.0, 25.0))
    plan = plan_demo(DemoSettings(), model, profile=zen5.name)
    decode = one_sequence_decode_s(model)
    assert plan.choice.tbt_slo_s == pytest.approx(25 * decode)
    assert "no SLO tried keeps every promise here" in plan.choice.slo_reason
    broken = broken_promises(simulate_demo(plan, model, SCHEDULERS[:2]))
    assert len(broken) == 1 and "TTFT" in broken[0]
