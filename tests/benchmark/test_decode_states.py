"""benchmarks/decode_states.py: samples split by the memory state they were taken in."""

from benchmarks.decode_states import by_state


def test_samples_are_summarized_per_state_by_their_medians():
    samples = [
        {"read_gb_per_s": 48.0, "step_ms": 19.0, "x_floor": 1.15},
        {"read_gb_per_s": 75.0, "step_ms": 15.0, "x_floor": 1.35},
        {"read_gb_per_s": 50.0, "step_ms": 18.0, "x_floor": 1.10},
        {"read_gb_per_s": 73.0, "step_ms": 15.4, "x_floor": 1.30},
        {"read_gb_per_s": 46.0, "step_ms": 20.0, "x_floor": 1.20},
    ]
    slower, faster = by_state(samples, 62.0)
    assert slower == {
        "state": "slower",
        "samples": 3,
        "read_gb_per_s": 48.0,
        "step_ms": 19.0,
        "x_floor": 1.15,
    }
    assert faster["state"] == "faster" and faster["samples"] == 2
    assert faster["read_gb_per_s"] == 74.0 and abs(faster["x_floor"] - 1.325) < 1e-12


def test_a_state_without_samples_is_left_out():
    rows = by_state([{"read_gb_per_s": 48.0, "step_ms": 19.0, "x_floor": 1.15}], 62.0)
    assert [r["state"] for r in rows] == ["slower"]
    assert by_state([], 62.0) == []
