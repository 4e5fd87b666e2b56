"""JSON responses rendered in small pieces, so a big body never holds the GIL for long.

Python's C JSON encoder keeps the GIL for a whole ``json.dumps`` call: 2,000 prompt positions with 20 log
probabilities each (~3 MB) held it for 40 ms alone and ~150 ms on a loaded 2-core machine, and every other
stream and ``/health`` waited that long, even from a worker thread. Encoding long lists a few items per
call, and offering the GIL between big pieces, lets the event loop in between.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from fastapi.responses import Response

_ITEMS_PER_PIECE = 32


def _dumps(obj: Any, allow_nan: bool = False) -> str:
    # Starlette's JSONResponse settings (our server-sent events' with allow_nan): the same bytes.
    return json.dumps(obj, ensure_ascii=False, allow_nan=allow_nan, indent=None, separators=(",", ":"))


def _has_containers(values) -> bool:
    return any(isinstance(v, dict | list) for v in values)


def _pieces(obj: Any, allow_nan: bool) -> Iterator[str]:
    """Long lists go a few items per call; the spine above them is walked; everything else is one call."""
    if isinstance(obj, list) and len(obj) > _ITEMS_PER_PIECE:
        yield "["
        for start in range(0, len(obj), _ITEMS_PER_PIECE):
            yield ("," if start else "") + _dumps(obj[start : start + _ITEMS_PER_PIECE], allow_nan)[1:-1]
        yield "]"
    elif isinstance(obj, list) and _has_containers(obj):
        yield "["
        for i, item in enumerate(obj):
            if i:
                yield ","
            yield from _pieces(item, allow_nan)
        yield "]"
    elif isinstance(obj, dict) and _has_containers(obj.values()):
        yield "{"
        for i, (key, value) in enumerate(obj.items()):
            yield ("," if i else "") + _dumps({key: 0})[1:-2]  # the key as json writes it, and its colon
            yield from _pieces(value, allow_nan)
        yield "}"
    else:
        yield _dumps(obj, allow_nan)


def render_json(obj: Any, allow_nan: bool = False) -> bytes:
    """``obj`` as JSON, byte for byte what ``JSONResponse(obj)`` sends, encoded in small pieces; between
    pieces it offers the GIL to other threads (the event loop) instead of waiting to be made to."""
    out = []
    for piece in _pieces(obj, allow_nan):
        out.append(piece)
        if len(piece) > 4096:
            time.sleep(0)
    return "".join(out).encode()


def sse_in_pieces(payload: dict) -> str:
    """``engine_requests.sse(payload)``, encoded by ``render_json``; call it in a worker thread."""
    return f"data: {render_json(payload, allow_nan=True).decode()}\n\n"


class PiecewiseJSONResponse(Response):
    """A JSON response encoded by ``render_json``; build it in a worker thread for big bodies."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return render_json(content)
