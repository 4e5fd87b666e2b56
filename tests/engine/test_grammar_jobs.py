"""Matchers are built off the step loop: a constrained request waits out of the scheduler until the
sampling worker reports its matcher ready, while the running requests keep stepping; a constraint whose
build fails is that request's error (``invalid_structured_output``), and aborting a waiting request
leaves nothing behind."""

from __future__ import annotations

from sarathi import LLMEngine, SamplingParams, build_engine
from sarathi.config import engine_config
from sarathi.structured_output import StructuredOutput

# Takes seconds to compile (past the server's --max-schema-chars; the engine itself applies no bounds).
HEAVY_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5000)}}


def make_engine() -> LLMEngine:
    """The served default (the file's quantization): its steps are fast, so many run while a matcher builds
    (float32 steps on a 2-core Xeon made the free request's 400 tokens take 18 s)."""
    return build_engine(engine_config(None, num_kv_blocks=256, max_model_len=512))


def test_a_heavy_constraint_compiles_while_other_requests_step():
    engine = make_engine()
    engine.add_request("free", "Count:", SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True))
    engine.step()  # the free request is decoding
    heavy = StructuredOutput.json_schema(HEAVY_SCHEMA)
    params = SamplingParams(temperature=0.0, max_tokens=3, structured_output=heavy)
    engine.add_request("json", "JSON:", params)
    steps_while_waiting, finished = 0, {}
    while engine.has_unfinished_requests():
        waiting = "json" in engine._compiling
        outputs = engine.step().outputs
        steps_while_waiting += waiting and any(o.request_id == "free" for o in outputs)
        finished.update({o.request_id: o for o in outputs if o.finished})
    # llguidance's parser may give up a token or two in (its rows outgrow 2,000 items at this width): that
    # is the request's own error, not a crash.
    json_out = finished["json"]
    assert json_out.finish_reason == "length" or json_out.error_code == "invalid_structured_output", json_out
    assert steps_while_waiting >= 3  # the free request kept getting tokens while the matcher was building
    assert finished["free"].num_output_tokens == 400
    engine.shutdown()


def test_failed_builds_and_aborts_of_waiting_requests():
    engine = make_engine()
    bad = SamplingParams(max_tokens=4, structured_output=StructuredOutput("grammar", 'start: start "a"'))
    engine.add_request("bad", "x", bad)
    yes_no = StructuredOutput.choice(["yes", "no"])
    ok = SamplingParams(temperature=0.0, max_tokens=4, structured_output=yes_no)
    engine.add_request("gone", "x", ok)
    engine.abort_request("gone")
    engine.add_request("ok", "Answer:", ok)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step().outputs if o.finished})
    assert finished["bad"].finish_reason == "error"
    assert finished["bad"].error_code == "invalid_structured_output"
    assert "admits no output" in finished["bad"].error and "\n" not in finished["bad"].error
    assert "gone" not in finished and finished["ok"].text in ("yes", "no")
    assert not engine._compiling and engine.block_manager.num_used_blocks == 0
    engine.shutdown()
