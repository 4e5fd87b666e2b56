"""Schema fuzzing of the live API from its own /openapi.json (schemathesis): valid and invalid bodies for
both create endpoints. No 5xx, every 4xx has the OpenAI error shape, every response conforms to what
/openapi.json documents (status, media type, body schema), and the server answers a greedy request exactly
as before."""

from __future__ import annotations

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.conftest import ServerProcess  # noqa: E402

ENDPOINTS = ["/v1/completions", "/v1/chat/completions"]
CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
GREEDY = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def fuzz_server():
    # A short context bounds the work of every valid request the fuzzer makes.
    srv = ServerProcess("--num-kv-blocks", "256", "--max-model-len", "48")
    yield srv
    srv.stop()


def _fuzz(srv: ServerProcess, path: str, mode: GenerationMode, examples: int) -> dict[int, int]:
    schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json")
    statuses: dict[int, int] = {}

    @settings(max_examples=examples, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=schema[path]["POST"].as_strategy(generation_mode=mode))
    def run(case) -> None:
        r = case.call(base_url=srv.url, timeout=120)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (case.body, r.text)
        # Every status, media type and body is one /openapi.json documents for this route.
        case.validate_response(r, checks=CONFORMANCE)
        if r.status_code >= 400:
            body = r.json()
            assert set(body) == {"error"}, body
            assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]

    run()
    return statuses


def _check_fuzz(srv: ServerProcess, examples: int) -> None:
    before = httpx.post(f"{srv.url}/v1/completions", json=GREEDY, timeout=120).json()["choices"][0]["text"]
    for path in ENDPOINTS:
        for mode in GenerationMode:
            statuses = _fuzz(srv, path, mode, examples)
            assert sum(statuses.values()) >= examples * 0.9, statuses
    after = httpx.post(f"{srv.url}/v1/completions", json=GREEDY, timeout=120).json()["choices"][0]["text"]
    assert after == before
    assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
    metrics = srv.metrics()
    assert metrics["sarathi_num_requests_running"] == 0 and metrics["sarathi_kv_cache_blocks_used"] == 0


def test_openapi_documents_the_request_bodies(fuzz_server):
    spec = httpx.get(f"{fuzz_server.url}/openapi.json", timeout=10).json()
    for path, model in zip(ENDPOINTS, ["CompletionRequest", "ChatCompletionRequest"], strict=True):
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        assert "prompt" in spec["components"]["schemas"]["CompletionRequest"]["properties"]
    for path, model in [("/tokenize", "TokenizeRequest"), ("/detokenize", "DetokenizeRequest")]:
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}


def test_bounded_fuzz_of_both_create_endpoints(fuzz_server):
    """100 valid-by-schema and 100 invalid bodies per endpoint (200 cases each)."""
    _check_fuzz(fuzz_server, 100)


@pytest.mark.slow
def test_long_fuzz_of_both_create_endpoints(fuzz_server):
    _check_fuzz(fuzz_server, 1500)
