"""Fixtures that run ``sarathi serve`` as a real subprocess on 127.0.0.1 and a free port (``RunningServer``,
shared with the benchmarks)."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest

from benchmarks.server import RunningServer, free_port, serve_command

STARTUP_TIMEOUT_S = 300


class ServerProcess(RunningServer):
    """``sarathi serve`` with ``flags`` and a fixed token budget unless they name one (no start-up simulation
    of the auto choice); ``engine_core_pid`` and ``worker_pids`` are those it started with."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        if "--token-budget" not in flags:
            flags = (*flags, "--token-budget", "64")
        port = free_port()
        api_key = (env or {}).get("SARATHI_API_KEY")
        super().__init__(
            serve_command(port, *flags), port, env=env, api_key=api_key, ready_timeout=STARTUP_TIMEOUT_S
        )
        try:
            effective = self.config()
        except BaseException:
            self.stop()
            raise
        self.engine_core_pid: int = effective["engine_core_pid"]
        self.worker_pids: list[int] = effective["worker_pids"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signals; it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # The process went away between the signal and the read (reading a vanished /proc entry is ESRCH).
        return False


def wait_for(condition, timeout_s: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def post_body(url: str, body: dict | bytes) -> httpx.Response:
    """POST a JSON body, or raw bytes labelled as JSON."""
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
    return httpx.post(url, json=body, timeout=60)


def check_sigterm_finishes_in_flight_requests(srv: ServerProcess) -> None:
    """SIGTERM while a 100-token stream runs: the stream finishes whole, then every process exits. (100: at
    ~5 ms a token a 20-token stream could end between two polls of the metrics.)"""
    result = {}

    def stream():
        body = {"prompt": "Count:", "max_tokens": 100, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=120) as r:
            result["lines"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    t = threading.Thread(target=stream)
    t.start()
    assert wait_for(lambda: srv.metrics()["sarathi_num_requests_running"] == 1, 30)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(120)
    srv.proc.wait(60)
    assert result["lines"][-1] == "data: [DONE]" and len(result["lines"]) == 101  # finished, not cut
    assert wait_for(lambda: not any(pid_alive(p) for p in [srv.engine_core_pid, *srv.worker_pids]), 15)
    assert "engine core stopped" in srv.output()


@pytest.fixture(scope="session")
def server():
    """One server for the whole session: the embedded model, fp32, default scheduler."""
    srv = ServerProcess("--num-kv-blocks", "2048", "--dtype", "float32")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def openai_client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def model_name(server) -> str:
    return httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
