"""Structured outputs through the official openai client: JSON schemas (response_format, guided_json,
structured_outputs), choices, regexes and grammars are always matched; bad ones are a 400 naming the
field."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]

_FIELD_TYPES = st.sampled_from(
    [
        {"type": "integer", "minimum": 0, "maximum": 999},
        {"type": "boolean"},
        {"type": "string", "maxLength": 8},
        {"enum": ["red", "green", "blue"]},
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 2},
    ]
)
SCHEMAS = st.dictionaries(
    st.from_regex(r"[a-z]{1,6}", fullmatch=True), _FIELD_TYPES, min_size=1, max_size=3
).map(
    lambda props: {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }
)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, temperature=st.sampled_from([0.0, 1.0]))
def test_json_schema_outputs_parse_and_validate(openai_client, model_name, schema, temperature):
    r = openai_client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        max_tokens=80,
        temperature=temperature,
        seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_guided_json_structured_outputs_and_json_object(openai_client, model_name):
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    for extra in ({"guided_json": json.dumps(schema)}, {"structured_outputs": {"json": schema}}):
        r = openai_client.completions.create(
            model=model_name, prompt="Age as JSON:", max_tokens=30, temperature=0, extra_body=extra
        )
        jsonschema.validate(json.loads(r.choices[0].text), schema)
    chunks = openai_client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        max_tokens=60,
        response_format={"type": "json_object"},
        stream=True,
        seed=0,  # a sample that closes its object within 60 tokens (some seeds write a longer one)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


def test_choice_regex_and_grammar(openai_client, model_name):
    create = openai_client.completions.create
    choices = ["sunny", "rainy", 'a "quoted" cloud']
    for seed in range(3):
        r = create(
            model=model_name,
            prompt="Weather:",
            max_tokens=10,
            seed=seed,
            extra_body={"guided_choice": choices},
        )
        assert r.choices[0].text in choices
    regex = r"[0-9]{3}-[a-z]{2}"
    r = create(model=model_name, prompt="Code:", max_tokens=10, seed=1, extra_body={"guided_regex": regex})
    assert re.fullmatch(regex, r.choices[0].text)
    gbnf = 'root ::= "yes" | "no" | "maybe " [0-9]'
    r = create(
        model=model_name, prompt="Answer:", max_tokens=5, extra_body={"structured_outputs": {"grammar": gbnf}}
    )
    assert re.fullmatch(r"yes|no|maybe [0-9]", r.choices[0].text)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "[a-z"}, "guided_regex"),
        ({"guided_json": {"type": "nope"}}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_grammar": "root ::= ("}, "guided_grammar"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/x"}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"structured_outputs": {"regex": "(", "choice": None}}, "structured_outputs.regex"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ],
)
def test_bad_constraints_are_a_400_naming_the_field(openai_client, model_name, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.completions.create(model=model_name, prompt="hi", max_tokens=1, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body
