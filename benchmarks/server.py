"""A server as a child process, for the tests and the benchmarks: ``sarathi serve`` (``serve_command``) or any
server with a ``/health`` route (llama.cpp's ``llama-server``), started in its own session on 127.0.0.1 and
a free port, ready once ``/health`` answers 200, stopped by its PID and then every process left in its
session. A sarathi server's effective config is read from its ``GET /server_info``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from benchmarks.cpu_load import session_cpu_seconds, session_pids
from sarathi.net import free_port

HOST = "127.0.0.1"
READY_TIMEOUT_S = 600.0

__all__ = ["HOST", "RunningServer", "free_port", "serve_command"]


def serve_command(port: int, *flags: str, python: str = sys.executable) -> list[str]:
    """``sarathi serve`` on HOST:``port`` with ``flags``."""
    return [python, "-m", "sarathi", "serve", "--host", HOST, "--port", str(port), *flags]


class RunningServer:
    """``command`` (listening on HOST:``port``) in its own session, its output in ``log_path`` (a temporary
    file if None). ``api_key``: the key ``config()`` sends. ``stop`` ends it by its PID (SIGTERM, then
    SIGKILL), then any process it left in its session, each by its PID."""

    def __init__(
        self,
        command: Sequence[str],
        port: int,
        log_path: Path | None = None,
        *,
        env: dict[str, str] | None = None,
        api_key: str | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        self.port, self.url, self.api_key = port, f"http://{HOST}:{port}", api_key
        if log_path is None:  # the log outlives this call (the server writes it until stop())
            fd, name = tempfile.mkstemp(prefix="server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            list(command),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
        )
        self.pid = self.proc.pid
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({self.proc.returncode}); see {self.log_path}:\n" + self.log_tail(50)
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(
            f"the server was not ready after {timeout:.0f} s; see {self.log_path}:\n" + self.log_tail(50)
        )

    def config(self) -> dict:
        """A sarathi server's effective config (``GET /server_info``): its engine core's and workers' PIDs,
        KV cache, limits and engine config."""
        headers = {} if self.api_key is None else {"authorization": f"Bearer {self.api_key}"}
        r = httpx.get(f"{self.url}/server_info", headers=headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics by name."""
        values = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def output(self) -> str:
        """Everything the server has printed so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """CPU seconds of every live process of the server's session."""
        return session_cpu_seconds(self.pid)

    def stop(self, timeout_s: float = 60) -> int | None:
        """Stop the server (SIGTERM, SIGKILL after ``timeout_s``) and whatever it left in its session; its
        exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in session_pids(self.pid):  # e.g. an engine process its parent did not end
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
