"""A benchmarked server as a child process: started in its own session on 127.0.0.1 and a free port, ready
once ``/v1/models`` answers, stopped by its PID, with its CPU time readable for the foreign-load guard."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.cpu_load import session_cpu_seconds, session_pids

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class RunningServer:
    """A server process in its own session; ``stop`` ends it by its PID (SIGTERM, then SIGKILL), then any
    process it left in its session, each by its PID."""

    def __init__(self, command: Sequence[str], port: int, log_path: Path, ready_timeout: float = 600.0):
        self.url = f"http://{HOST}:{port}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            list(command), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pid = self.proc.pid
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({self.proc.returncode}); see {self.log_path}:\n" + self.log_tail()
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the server was not ready after {timeout:.0f} s; see {self.log_path}")

    def log_tail(self, lines: int = 15) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        return session_cpu_seconds(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in session_pids(self.pid):  # e.g. an engine process its parent did not end
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._log.close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
