"""benchmarks/vs_llama_cpp.py's pure logic: server command lines, /proc parsing, foreign load, the capacity
searches over one probe memo, the best llama.cpp setting, shared loads. Probes are fabricated (a made-up
monotone latency curve per setting); nothing here builds llama.cpp or starts a server."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import cpu_load
from benchmarks import llama_cpp_build as build
from benchmarks import serving_probes as probes
from benchmarks import vs_llama_cpp as vs
from benchmarks import vs_llama_cpp_report as report


def test_llama_server_command_has_the_issue_flags_and_caps_the_ubatch():
    cmd = vs.llama_server_command("/x/llama-server", "/m/model.BF16.gguf", 8123, 2048)
    assert cmd[0] == "/x/llama-server"

    def flag(name):
        return cmd[cmd.index(name) + 1]

    assert flag("-m") == "/m/model.BF16.gguf"
    assert flag("--host") == "127.0.0.1" and flag("--port") == "8123"
    assert (flag("-t"), flag("-np"), flag("-c"), flag("--cache-ram")) == ("2", "16", "32768", "0")
    assert "-cb" in cmd
    assert (flag("-b"), flag("-ub")) == ("2048", "512")
    small = vs.llama_server_command("s", "m", 1, 32)
    assert (small[small.index("-b") + 1], small[small.index("-ub") + 1]) == ("32", "32")


def test_sarathi_serve_command_serves_the_same_file_at_its_defaults():
    cmd = vs.sarathi_serve_command(9000, 128, "/m/model.Q8_0.gguf", python="py")
    assert cmd[:4] == ["py", "-m", "sarathi", "serve"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "9000"
    assert cmd[cmd.index("--token-budget") + 1] == "128"
    assert cmd[cmd.index("--model") + 1] == "/m/model.Q8_0.gguf"
    assert "--quantization" not in cmd and "--dtype" not in cmd  # the file's own quantization by default


def test_server_command_dispatch():
    assert vs.server_command(vs.ServerSetting("sarathi", 64), 1, "w.gguf")[-1] == "w.gguf"
    cmd = vs.server_command(vs.ServerSetting("llama.cpp", 256), 1, "w.gguf")
    assert Path(cmd[0]).name == "llama-server" and cmd[cmd.index("-ub") + 1] == "256"
    with pytest.raises(ValueError):
        vs.server_command(vs.ServerSetting("other", 64), 1, "w.gguf")


def test_model_and_quant_axes_are_checked():
    args = vs.parse_args(["--model", "smollm2-135m,gemma3-270m", "--quant", "shipped,Q8_0"])
    assert args.model == ["smollm2-135m", "gemma3-270m"] and args.quant == ["shipped", "Q8_0"]
    assert vs.parse_args([]).quant == ["shipped"]
    with pytest.raises(SystemExit):
        vs.parse_args(["--quant", "Q3_K"])
    with pytest.raises(SystemExit):
        vs.parse_args(["--model", "llama-8b"])


def test_settings_each_once():
    settings = vs.settings_for([64, 2048], 64, {"strict": 64, "relaxed": 256})
    assert [s.label for s in settings] == [
        "llama.cpp -b 64",
        "llama.cpp -b 2048",
        "sarathi budget 64",
        "sarathi budget 256",
    ]


def test_build_commands_build_only_the_needed_targets_without_the_web_ui():
    conf = build.cmake_configure_command(Path("src"), Path("b"))
    for f in ("-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF",
              "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_BUILD_TYPE=Release"):  # fmt: skip
        assert f in conf
    assert conf[conf.index("-G") + 1] == "Ninja"
    cmd = build.cmake_build_command(Path("b"), 2)
    assert cmd[cmd.index("--target") + 1 :] == [
        "llama-server",
        "llama-quantize",
        "llama-bench",
        "llama-batched-bench",
    ]


def test_parse_proc_stat_handles_spaces_and_parens_in_the_name():
    fields = ["S", "1", "100", "4242"] + ["0"] * 7 + ["50", "25", "10", "5"] + ["0"] * 30
    sid, ticks = cpu_load.parse_proc_stat("123 (a (b) c) " + " ".join(fields))
    assert sid == 4242 and ticks == 90


def test_foreign_load():
    # 2 cores for 10 s; 14 busy CPU-seconds of which we used 1 and the server 12: 1 s foreign = 5%.
    assert cpu_load.foreign_load(14.0, 1.0, 12.0, 10.0, 2) == pytest.approx(0.05)
    assert cpu_load.foreign_load(10.0, 1.0, 12.0, 10.0, 2) == 0.0
    assert cpu_load.foreign_load(1.0, 0.0, 0.0, 0.0, 2) == 0.0


def _record(qps, tbt_p99, ttft_p50=0.2, failed=0):
    return probes.ProbeRecord(
        qps, ttft_p50, 2 * ttft_p50, tbt_p99 / 2, tbt_p99, 100.0, 48, failed, 0.0, 1, False
    )


def _search(setting, knee, tbt_at_knee=0.1, slope=4.0):
    """A made-up system: P99 TBT grows with load and reaches ``tbt_at_knee`` at QPS ``knee``."""
    measured = []

    def measure(qps):
        measured.append(qps)
        return _record(qps, tbt_at_knee * (qps / knee) ** slope)

    settings = vs.SearchSettings(qps_start=2.0, qps_min=0.05, qps_max=64.0, rel_tol=0.1, max_probes=6)
    result = probes.capacity_searches(measure, probes.SLOS, settings, probes.SettingResult(setting, "arxiv"))
    return result, measured


def test_capacity_searches_share_one_memo_across_slos():
    result, measured = _search(vs.ServerSetting("llama.cpp", 64), knee=3.0)
    assert len(measured) == len(set(measured)) == len(result.probes)  # no load measured twice
    strict, relaxed = (result.capacity[s.label] for s in probes.SLOS)
    assert 0 < strict <= 3.0 < relaxed
    assert result.probes[probes.qps_key(strict)].tbt_p99 <= 0.1
    assert 2.0 in result.probes  # every search starts at qps_start: a load all settings share


def test_a_failed_request_fails_the_probe_and_median_ttft_bounds_it():
    slo = probes.SLOS[1]
    assert _record(1.0, 0.05).probe().meets(slo)
    assert not _record(1.0, 0.05, failed=1).probe().meets(slo)
    assert not _record(1.0, 0.05, ttft_p50=2.5).probe().meets(slo)


def test_best_setting_highest_capacity_then_lower_tbt_then_smaller_knob():
    slo = probes.SLOS[0]

    def result(knob, cap, tbt):
        r = probes.SettingResult(vs.ServerSetting("llama.cpp", knob), "arxiv")
        r.capacity[slo.label] = cap
        if cap:
            r.probes[probes.qps_key(cap)] = _record(cap, tbt)
        return r

    assert probes.best_setting([result(32, 1.0, 0.05), result(2048, 2.0, 0.09)], slo).setting.knob == 2048
    assert probes.best_setting([result(32, 2.0, 0.09), result(2048, 2.0, 0.05)], slo).setting.knob == 2048
    assert probes.best_setting([result(256, 2.0, 0.05), result(64, 2.0, 0.05)], slo).setting.knob == 64
    assert probes.best_setting([result(256, 0.0, 0), result(64, 0.0, 0)], slo).setting.knob == 64


def test_shared_loads_and_the_cdf_load():
    a, _ = _search(vs.ServerSetting("llama.cpp", 64), knee=3.0)
    b, _ = _search(vs.ServerSetting("sarathi", 64), knee=6.0)
    loads = probes.shared_loads([a, b])
    assert loads == sorted(set(a.probes) & set(b.probes)) and 2.0 in loads
    q = probes.cdf_load([a, b], probes.SLOS[1])
    assert q in loads and all(r.probes[q].probe().meets(probes.SLOS[1]) for r in (a, b))
    assert probes.cdf_load([], probes.SLOS[1]) is None


def test_compare_picks_roles_per_slo():
    results = [
        _search(vs.ServerSetting("llama.cpp", 64), knee=3.0)[0],
        _search(vs.ServerSetting("llama.cpp", 2048), knee=2.0, slope=1.0)[0],
        _search(vs.ServerSetting("sarathi", 64), knee=5.0)[0],
        _search(vs.ServerSetting("sarathi", 256), knee=4.0, slope=1.0)[0],
    ]
    tuned = {"strict 100ms": 64, "relaxed 500ms": 256}
    c = report.compare(results, tuned, 64, {}, 2.0)
    for slo in probes.SLOS:
        best = probes.best_setting(results[:2], slo)
        assert c["compared"][slo.label]["llama.cpp best"] == best.setting.label
        assert c["capacity_qps"][slo.label]["llama.cpp best"] == best.capacity[slo.label]
        assert c["compared"][slo.label]["sarathi tuned"] == f"sarathi budget {tuned[slo.label]}"
    assert set(c["lowest_failing_qps"]) == {s.label for s in probes.SLOS}
    assert "2" in c["shared_loads"]
    assert set(c["shared_loads"]["2"]) == set(c["compared_settings"])


def test_quick_and_full_defaults():
    q = vs.parse_args(["--quick"])
    assert (q.workloads, q.batches, q.num_requests, q.max_probes) == (["arxiv"], [64, 2048], 48, 3)
    f = vs.parse_args([])
    assert f.workloads == ["arxiv", "sharegpt"] and f.batches == [32, 64, 256, 2048] and f.num_requests >= 48
    with pytest.raises(SystemExit):
        vs.parse_args(["--num-requests", "10"])


def test_pow2_near():
    assert probes.pow2_near(4.76) == 4.0 and probes.pow2_near(6.1) == 8.0 and probes.pow2_near(0.0) == 1.0
    assert math.isclose(probes.pow2_near(0.3), 0.25)


def test_fresh_prompts_keep_arrivals_and_lengths_and_differ_per_salt():
    import numpy as np

    from sarathi.benchmark.workload import BenchRequest

    base = [BenchRequest("a", 0.0, 5, 3), BenchRequest("b", 0.5, 40, 7)]
    allowed = np.arange(10, 1000)
    one = probes.fresh_prompts(base, allowed, (0, 4000000, 1))
    assert [(r.request_id, r.arrival_time, r.num_prompt_tokens, r.num_output_tokens) for r in one] == [
        ("a", 0.0, 5, 3),
        ("b", 0.5, 40, 7),
    ]
    assert all(len(r.prompt_token_ids) == r.num_prompt_tokens for r in one)
    assert all(10 <= t < 1000 for r in one for t in r.prompt_token_ids)
    assert probes.fresh_prompts(base, allowed, (0, 4000000, 1)) == one  # deterministic
    other = probes.fresh_prompts(base, allowed, (0, 4000000, 2))
    assert other[1].prompt_token_ids != one[1].prompt_token_ids


def test_capacity_text_says_below_the_lowest_probe():
    assert report.capacity_text(2.828, 4.0) == "2.83"
    assert report.capacity_text(0.0, 1.0) == "<1"
    assert report.capacity_text(0.0, None) == "0"


def test_llama_server_runs_without_repacking_where_llama_cpp_crashes_with_it(monkeypatch):
    asked = []

    def crashes(bench, gguf, threads=2, log=print):
        asked.append(gguf)
        return gguf.name == "amx-crash.gguf"

    monkeypatch.setattr(vs, "repack_crashes", crashes)
    setting = vs.ServerSetting("llama.cpp", 256)
    assert vs.server_command(setting, 1, "amx-crash.gguf")[-1] == "--no-repack"
    assert "--no-repack" not in vs.server_command(setting, 1, "w.gguf")
    assert [p.name for p in asked] == ["amx-crash.gguf", "w.gguf"]


def test_repack_probe_without_a_build_is_false(tmp_path):
    from benchmarks import llama_cpp_kernels as lk

    assert not lk.repack_crashes(tmp_path / "llama-bench", tmp_path / "m.gguf", log=None)
