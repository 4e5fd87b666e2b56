"""Fixtures that run ``sarathi serve`` as a real subprocess on 127.0.0.1 and a free port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import openai
import pytest

STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A ``sarathi serve`` subprocess; ``stop()`` ends it (and its engine core) by PID."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if "--token-budget" not in flags:  # a fixed budget: no start-up simulation of the auto choice
            flags = (*flags, "--token-budget", "64")
        # The log outlives this call (the server writes it until stop()).
        self.log = tempfile.NamedTemporaryFile("w+", prefix="sarathi-serve-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sarathi", "serve", "--port", str(self.port), *flags],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )
        self._wait_ready()
        effective = self._effective_config()
        self.engine_core_pid = effective["engine_core_pid"]
        self.worker_pids: list[int] = effective["worker_pids"]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sarathi serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"sarathi serve did not start in {STARTUP_TIMEOUT_S} s:\n{self.output()}")

    def _effective_config(self) -> dict:
        for line in self.output().splitlines():
            if line.startswith("sarathi serve: effective config "):
                return json.loads(line.removeprefix("sarathi serve: effective config "))
        raise RuntimeError(f"no effective config line in the server output:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics by name."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in [self.engine_core_pid, *self.worker_pids]:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        return self.proc.returncode


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signals; it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
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
    """SIGTERM while a 20-token stream runs: the stream finishes whole, then every process exits."""
    result = {}

    def stream():
        body = {"prompt": "Count:", "max_tokens": 20, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=120) as r:
            result["lines"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    t = threading.Thread(target=stream)
    t.start()
    assert wait_for(lambda: srv.metrics()["sarathi_num_requests_running"] == 1, 30)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(120)
    srv.proc.wait(60)
    assert result["lines"][-1] == "data: [DONE]" and len(result["lines"]) == 21  # finished, not cut
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
