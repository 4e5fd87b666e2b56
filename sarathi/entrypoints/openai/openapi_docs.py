"""/openapi.json with the request bodies and the error responses: schema fuzzers and client generators see
what the endpoints take and every status they may answer."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from sarathi.entrypoints.openai.guards import needs_api_key

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}
# The body of every error (APIError.body()).
ERROR_RESPONSE_SCHEMA = {
    "title": "ErrorResponse",
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": _NULLABLE_STRING,
                "code": _NULLABLE_STRING,
            },
        }
    },
}
# One server-sent event of a stream (before OpenAPI 3.2 the schema of an event stream is that of each event):
# its data is a JSON chunk or error object, and "[DONE]" last.
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
_ERROR_DESCRIPTIONS = {
    400: "Invalid request (the error names the field in param), or a Host not in --allowed-hosts",
    401: "Missing or wrong API key (--api-key)",
    404: "No such model (the model field names another one), or no such resource",
    413: "Request body larger than --max-body-bytes",
    415: "Content-Type is not application/json",
    429: "The waiting queue is full (--max-waiting); retry after Retry-After seconds",
    500: "Internal error",
    503: "The engine core is dead or not responding",
}


def error_statuses(path: str, method: str) -> list[int]:
    """The error statuses a route may answer (from the access checks and what the route does)."""
    statuses = {400, 500}
    if needs_api_key(path):
        statuses.add(401)
    if method == "post":
        statuses |= {404, 413, 415}  # body size and type checks; a request may name another model
    if method == "post" and path.startswith("/v1/"):
        statuses |= {429, 503}  # a request for the engine: its queue may be full, or the engine dead
    if path == "/health":
        statuses.add(503)
    if "{" in path:
        statuses.add(404)
    return sorted(statuses)


def document_request_bodies(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """Put the request models' JSON schemas into /openapi.json (the endpoints read the raw body to answer
    every malformed one with an OpenAI-style error, so FastAPI cannot see them), and every route's error
    responses with the OpenAI-style error body."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, model in bodies.items():
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
                ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                operation = schema["paths"][path]["post"]
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": ref}},
                }
                if "stream" in model.model_fields:
                    ok = operation["responses"]["200"].setdefault("content", {})
                    ok["text/event-stream"] = {"schema": _SSE_EVENT}
            components["ErrorResponse"] = ERROR_RESPONSE_SCHEMA
            for path, operations in schema["paths"].items():
                for method, operation in operations.items():
                    for status in error_statuses(path, method):
                        operation["responses"][str(status)] = {
                            "description": _ERROR_DESCRIPTIONS[status],
                            "content": {"application/json": {"schema": _ERROR_REF}},
                        }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
