"""The input processor: every check raises InvalidRequestError carrying the request field as data."""

from __future__ import annotations

import pytest

from sarathi.engine.core_messages import Rejection, RejectReason
from sarathi.engine.input_processor import EngineRequest, InputProcessor, InvalidRequestError
from sarathi.sampling_params import SamplingParams
from sarathi.structured_output import ConstraintError, StructuredOutput, StructuredOutputLimits

VOCAB = 100


class _Tokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) % VOCAB for c in text]


def _processor(**kwargs) -> InputProcessor:
    return InputProcessor(VOCAB, _Tokenizer(), **kwargs)


def _refused(call, *args) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        call(*args)
    assert isinstance(info.value, ValueError) and str(info.value) == info.value.message
    return info.value


def test_a_good_request_becomes_an_engine_request():
    params = SamplingParams(stop_token_ids=[VOCAB - 1], logit_bias={"7": 1.0})
    request = _processor().process("hi", params)
    assert request == EngineRequest([ord("h") % VOCAB, ord("i") % VOCAB], params)
    assert _processor().process([1, 2, 3], params).prompt_token_ids == [1, 2, 3]


@pytest.mark.parametrize(
    ("prompt", "params", "param", "code", "words"),
    [
        ("", SamplingParams(), "prompt", "empty_prompt", "empty"),
        ([], SamplingParams(), "prompt", "empty_prompt", "empty"),
        ([1, VOCAB], SamplingParams(), "prompt", "invalid_token_id", "[0, 100)"),
        ([1, -1], SamplingParams(), "prompt", "invalid_token_id", "[0, 100)"),
        ([1, True], SamplingParams(), "prompt", "invalid_token_id", "integers"),
        ("hi", SamplingParams(stop_token_ids=[VOCAB + 5]), "stop_token_ids", None, "[0, 100)"),
        ("hi", SamplingParams(logit_bias={VOCAB: 1.0}), "logit_bias", None, "[0, 100)"),
        ("hi", SamplingParams(n=2), "n", None, "one sequence per request"),
        ("hi", SamplingParams(best_of=3), "n", None, "one sequence per request"),
    ],
)
def test_each_check_names_its_field(prompt, params, param, code, words):
    error = _refused(_processor().process, prompt, params)
    assert (error.param, error.code) == (param, code) and words in error.message


def test_text_and_structured_outputs_need_a_tokenizer():
    bare = InputProcessor(VOCAB)
    assert _refused(bare.process, "hi", SamplingParams()).param == "prompt"
    constrained = SamplingParams(structured_output=StructuredOutput("regex", "a+", source="guided_regex"))
    error = _refused(bare.process, [1], constrained)
    assert (error.param, error.code) == ("guided_regex", "unsupported")


def test_a_structured_output_is_bounded_then_compiled_once_here():
    compiled = []

    def compile_constraint(constraint: StructuredOutput) -> None:
        compiled.append(constraint)
        if constraint.spec == "bad":
            raise ConstraintError("the constraint does not compile: nope")

    processor = _processor(
        constraint_limits=StructuredOutputLimits(max_regex_chars=8), compile_constraint=compile_constraint
    )
    long = SamplingParams(structured_output=StructuredOutput("regex", "a" * 9, source="guided_regex"))
    error = _refused(processor.check_params, long)
    assert (error.param, error.code) == ("guided_regex", "invalid_structured_output")
    assert "--max-regex-chars" in error.message and not compiled  # refused before any compile
    bad = SamplingParams(structured_output=StructuredOutput("grammar", "bad"))
    error = _refused(processor.check_params, bad)
    assert error.param == "structured_output" and error.message.startswith(
        "structured_output: the constraint"
    )
    good = SamplingParams(structured_output=StructuredOutput("regex", "a+"))
    assert processor.check_params(good) is good and len(compiled) == 2


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"logit_bias": {"7": 500}}, "logit_bias"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_sampling_params_ranges_raise_the_typed_error(kwargs, param):
    error = _refused(lambda: SamplingParams(**kwargs))
    assert error.param == param and error.message.startswith(param)


def test_a_rejection_carries_its_reason_and_field_as_data():
    rejection = Rejection("r", "too long", param="prompt")
    assert rejection.reason is RejectReason.INVALID and rejection.param == "prompt"
    assert Rejection("r", "full", RejectReason.OVERLOADED).param is None


class _Engine:
    """What EngineCore._handle touches: the waiting count and add_request (refusing too long prompts)."""

    def __init__(self, num_waiting: int = 0) -> None:
        self.num_waiting = num_waiting

    def add_request(self, request_id, request, arrival_time, after):
        if len(request.prompt_token_ids) > 3:
            raise InvalidRequestError("prompt has 4 tokens, more than max_model_len=3", "prompt")
        if request_id == "bug":
            raise KeyError("oops")


@pytest.mark.parametrize(
    ("request_id", "ids", "num_waiting", "reason", "param"),
    [
        ("long", [1, 2, 3, 4], 0, RejectReason.INVALID, "prompt"),
        ("bug", [1], 0, RejectReason.INTERNAL, None),
        ("full", [1], 8, RejectReason.OVERLOADED, None),
    ],
)
def test_the_engine_core_rejects_with_a_typed_reason(request_id, ids, num_waiting, reason, param, capsys):
    from sarathi.engine.core_messages import AddRequest, CoreOutputs
    from sarathi.engine.engine_core import EngineCore

    core = EngineCore(_Engine(num_waiting), None, None, max_waiting=8)
    out = CoreOutputs()
    core._handle(AddRequest(request_id, EngineRequest(ids, SamplingParams()), 0.0), out)
    [rejection] = out.rejected
    assert (rejection.request_id, rejection.reason, rejection.param) == (request_id, reason, param)
    core._handle(AddRequest("ok", EngineRequest([1], SamplingParams()), 0.0), out := CoreOutputs())
    assert out.accepted == (["ok"] if num_waiting < 8 else [])
