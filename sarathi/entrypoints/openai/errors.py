"""The OpenAI-style error every API failure is answered with, and pydantic's errors turned into it."""

from __future__ import annotations

from pydantic import ValidationError

from sarathi.sampling_params import InvalidRequestError


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid_request(e: InvalidRequestError, param: str | None = None) -> APIError:
    """A 400 for a request the input processor or SamplingParams refused (``param`` overrides its field)."""
    return APIError(e.message, param=param or e.param, code=e.code)


def validation_error(e: ValidationError) -> APIError:
    """The first pydantic error as an APIError naming the offending field."""
    err = e.errors()[0]
    # Union members show up in the location as type names ("str", "list[int]"); they are not fields.
    path = [str(p) for p in err["loc"] if not (isinstance(p, str) and (p in _TYPE_NAMES or "[" in p))]
    param = ".".join(path) or None
    if len(e.errors()) > 1 and all(x["loc"][:1] == err["loc"][:1] for x in e.errors()):
        return APIError(f"{param}: not a valid value of any accepted type", param=param)
    return APIError(f"{param}: {err['msg']}" if param else err["msg"], param=param)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}
