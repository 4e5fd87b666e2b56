"""``free_port``: the one helper that picks a TCP port for a server or a rendezvous (executors, the tests'
and benchmarks' servers); ``bind_listener``: a server's listening socket, bound before anything else starts.
Standard library only, so every layer may import it."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; it stays free until someone binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (0: the OS picks a port), to be listened on by the HTTP server.
    Bound before the server starts its engine and workers: a port picked free and left unbound until after
    their start can be taken by one of their own ephemeral sockets (a rendezvous, a collective's link)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
