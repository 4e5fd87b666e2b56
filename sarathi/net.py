"""``free_port``: the one helper that picks a TCP port for a server or a rendezvous (executors, the tests'
and benchmarks' servers). Standard library only, so every layer may import it."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; it stays free until someone binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
