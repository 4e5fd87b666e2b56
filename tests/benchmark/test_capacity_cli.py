"""``sarathi capacity`` end to end on the embedded model with a tiny workload and a two-probe search."""

from __future__ import annotations

import json

from sarathi.entrypoints.cli import main


def test_capacity_command_writes_json_and_plots(tmp_path, capsys):
    out = tmp_path / "cap"
    rc = main(
        [
            "capacity",
            "--schedulers",
            "sarathi",
            "--trace",
            "synthetic",
            "--prompt-len",
            "16",
            "--output-len",
            "3",
            "--num-requests",
            "2",
            "--num-kv-blocks",
            "16",
            "--slo-multiple",
            "5,25",
            "--decode-time",
            "0.2",
            "--slo",
            "0.000001",
            "--qps-start",
            "2",
            "--max-probes",
            "2",
            "--output-dir",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    result = json.loads((out / "capacity.json").read_text())
    assert result["decode_iteration_time"] == 0.2
    slos = result["slos"]
    assert [v["sarathi"]["slo_tbt_p99"] for v in slos.values()] == [0.000001, 1.0, 5.0]
    impossible = slos["0.001ms"]["sarathi"]
    assert impossible["capacity_qps"] == 0.0 and not any(p["meets"] for p in impossible["probes"])
    # The probes are shared between SLOs: the same loads were measured once and judged per SLO.
    qps_seen = {p["qps"] for v in slos.values() for p in v["sarathi"]["probes"]}
    assert len(list((out / "probes").iterdir())) == len(qps_seen)
    for png in ("capacity_bars.png", "capacity_vs_slo.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "QPS" in capsys.readouterr().out


def test_capacity_needs_an_slo(tmp_path, capsys):
    assert main(["capacity", "--output-dir", str(tmp_path)]) == 2
    assert "--slo" in capsys.readouterr().err
