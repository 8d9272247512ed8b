"""A failure of the machinery is never a wrong answer: kill the server's zygote (every
sandbox's init with it) while a program runs, and the answer says SandboxError / infra;
the server then recovers by itself."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from tests.service.conftest import Server, wait_for


def _zygotes(server_pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        # the zygote runs zygote.py as `python3 -I -B /dev/fd/N` (pool._spawn_zygote)
        if b"\0-I\0-B\0/dev/fd/" in cmd and ppid == server_pid:
            found.append(int(name))
    return found


def test_broken_sandbox_is_sandbox_error_then_recovers() -> None:
    s = Server()
    try:
        with s.client() as c, s.client() as probe:
            ok = {"code": "print(1)", "language": "python"}
            assert c.post("/run_code", json=ok).json()["status"] == "Success"
            zygotes = _zygotes(s.proc.pid)
            assert zygotes
            out: list[Any] = []
            slow = {"code": "import time; time.sleep(3); print(1)", "language": "python"}
            t = threading.Thread(target=lambda: out.append(c.post("/run_code", json=slow)))
            t.start()
            assert wait_for(lambda: probe.get("/v1/status").json()["admission"]["running"] == 1)
            time.sleep(0.3)  # the program is running now
            for pid in zygotes:  # ours: the server's own child
                os.kill(pid, signal.SIGKILL)
            t.join()
            body = out[0].json()
            assert out[0].status_code == 200
            assert body["status"] == "SandboxError", body
            assert body["run_result"]["trialbox_status"] == "infra"
            assert "infrastructure" in body["message"]
            # The pool starts a new zygote; the next runs succeed.
            assert c.post("/run_code", json=ok).json()["status"] == "Success"
            r = c.post("/v1/exec", json={"code": "print(2)"}).json()["result"]
            assert r["status"] == "ok" and r["stdout"] == "2\n"
            assert c.get("/readyz").status_code == 200
    finally:
        s.stop()
