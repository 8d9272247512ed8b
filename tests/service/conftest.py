"""The real server, started as `trialbox serve --port 0` in a subprocess and spoken to
over HTTP on loopback with httpx. Nothing is faked: each server has its own CellPool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import load_scaled
from tests.sandbox.conftest import processes_in_cgroup

LISTENING = "trialbox serve: listening on "


class Server:
    """One `trialbox serve` process; `stop()` (SIGTERM, then SIGKILL) when done."""

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 host: str = "127.0.0.1", token: str | None = None):
        self.token = token
        argv = [sys.executable, "-m", "trialbox.cli", "serve", "--host", host, "--port", "0",
                "--warm", "2", *args]
        if token:
            argv += ["--token", token]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="trialbox-serve-", suffix=".log")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env={**os.environ, **(env or {})})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the server listens, or exits
        if not line.startswith(LISTENING):
            self.proc.wait(timeout=30)
            raise RuntimeError(f"server did not start (exit {self.proc.returncode}): "
                               f"{line!r} {self.stderr()}")
        self.url = line[len(LISTENING):].strip()

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def client(self, token: str | None = None, timeout: float = 60,
               **kw: Any) -> httpx.Client:
        token = token if token is not None else self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers, **kw)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def pool_processes(server_pid: int) -> list[int]:
    """Processes in cgroups of the pool the server `server_pid` owned (its pool's cgroup
    names start with `<pid>-`)."""
    return processes_in_cgroup(f"trialbox/{server_pid}-")


def wait_for(pred: Any, timeout: float = 10.0) -> bool:
    """Poll `pred()` until true or `load_scaled(timeout)` passed; its last value."""
    end = time.monotonic() + load_scaled(timeout)
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """A server with default settings (but 2 warm cells), shared by the suite."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c
