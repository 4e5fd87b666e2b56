"""Edges of the HTTP surface through a live ``sarathi serve``: the tokenizer routes behind the API key and
the Content-Type check, /health's JSON body, /server_info (the effective config) behind the key, 405 with
Allow, and /openapi.json documenting every error response with the body the server really sends, and tool
schema errors naming their tool."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.server.conftest import ServerProcess

KEY = "sekret"
AUTH = {"authorization": f"Bearer {KEY}"}
ERROR_STATUSES = {"400", "401", "404", "413", "415", "429", "500", "503"}


@pytest.fixture(scope="module")
def keyed_server():
    srv = ServerProcess("--num-kv-blocks", "64", env={"SARATHI_API_KEY": KEY})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def error_schema(keyed_server) -> dict:
    spec = httpx.get(f"{keyed_server.url}/openapi.json", timeout=10).json()
    return {**spec["components"]["schemas"]["ErrorResponse"], "components": spec["components"]}


def _assert_error(r: httpx.Response, status: int, error_schema: dict) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    jsonschema.validate(r.json(), error_schema)
    return r.json()["error"]


@pytest.mark.parametrize("path, body", [("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})])
def test_tokenizer_routes_need_the_api_key_and_a_json_body(keyed_server, error_schema, path, body):
    url = f"{keyed_server.url}{path}"
    for headers in ({}, {"authorization": "Bearer wrong"}):
        error = _assert_error(httpx.post(url, json=body, headers=headers, timeout=60), 401, error_schema)
        assert error["type"] == "authentication_error"
    text = {"content-type": "text/plain", **AUTH}
    r = httpx.post(url, content=json.dumps(body).encode(), headers=text, timeout=60)
    assert _assert_error(r, 415, error_schema)["code"] == "unsupported_media_type"
    r = httpx.post(url, json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200 and ("tokens" in r.json() or "prompt" in r.json()), r.text


def test_health_answers_a_json_body(keyed_server):
    r = httpx.get(f"{keyed_server.url}/health", timeout=10)  # no key needed
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"status": "ok"}


def test_a_405_names_the_allowed_methods(keyed_server, error_schema):
    r = httpx.get(f"{keyed_server.url}/v1/completions", headers=AUTH, timeout=10)
    _assert_error(r, 405, error_schema)
    assert r.headers["allow"] == "POST"
    r = httpx.post(f"{keyed_server.url}/health", json={}, timeout=10)
    _assert_error(r, 405, error_schema)
    assert r.headers["allow"] == "GET"


def test_openapi_documents_the_error_responses(keyed_server):
    spec = httpx.get(f"{keyed_server.url}/openapi.json", timeout=10).json()
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            errors = {s: r for s, r in operation["responses"].items() if s[0] in "45" and s != "422"}
            assert {"400", "500"} <= set(errors), (path, method)
            for status, response in errors.items():
                assert response["content"] == {"application/json": {"schema": ref}}, (path, status)
    for path in ("/v1/completions", "/v1/chat/completions"):
        operation = spec["paths"][path]["post"]
        assert set(operation["responses"]) >= ERROR_STATUSES
        assert "text/event-stream" in operation["responses"]["200"]["content"]
    for path in ("/tokenize", "/detokenize"):
        assert {"400", "401", "404", "413", "415", "500"} <= set(spec["paths"][path]["post"]["responses"])
    assert "503" in spec["paths"]["/health"]["get"]["responses"]
    assert "401" not in spec["paths"]["/health"]["get"]["responses"]


def test_server_info_is_the_effective_config_behind_the_api_key(keyed_server, error_schema):
    url = f"{keyed_server.url}/server_info"
    for headers in ({}, {"authorization": "Bearer wrong"}):
        assert _assert_error(httpx.get(url, headers=headers, timeout=10), 401, error_schema)["code"] == (
            "invalid_api_key"
        )
    r = httpx.get(url, headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    info = r.json()
    printed = keyed_server.output().split("sarathi serve: effective config ", 1)[1].splitlines()[0]
    assert info == json.loads(printed)  # the start-up line, served
    assert info["api_key_required"] is True and info["served_model_name"] == "SmolLM2-135M-Instruct"
    assert (info["num_kv_blocks"], info["cache"]["num_kv_blocks"]) == (64, 64)
    assert info["scheduler"]["name"] == "sarathi" and info["scheduler"]["token_budget"] == 64
    assert info["engine_core_pid"] == keyed_server.engine_core_pid
    spec = httpx.get(f"{keyed_server.url}/openapi.json", timeout=10).json()
    assert "401" in spec["paths"]["/server_info"]["get"]["responses"]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "broken"}}])
def test_a_tool_schema_that_does_not_compile_names_its_tool(keyed_server, error_schema, tool_choice):
    broken = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    tools = [
        {"type": "function", "function": {"name": "fine", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "broken", "parameters": broken}},
    ]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": tool_choice}
    r = httpx.post(f"{keyed_server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    error = _assert_error(r, 400, error_schema)
    assert error["param"] == "tools.1.function.parameters", error
