"""Auth, request size, rate limits, overload, deadlines and shutdown, each against a
real server started with the setting under test."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import load_scaled
from tests.service.conftest import Server, pool_processes, wait_for

from trialbox.errors import UsageError
from trialbox.service.config import ServiceConfig


@pytest.fixture
def started() -> Iterator[list[Server]]:
    servers: list[Server] = []
    yield servers
    for s in servers:
        s.stop()


def test_token_required_except_health(started: list[Server]) -> None:
    s = Server(token="t0ken-123")
    started.append(s)
    with s.client(token="") as anon, s.client(token="wrong") as bad, s.client() as good:
        r = anon.post("/v1/exec", json={"code": "print(1)"})
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert "Bearer" in r.json()["message"]
        assert bad.post("/run_code", json={"code": "1", "language": "python"}
                        ).status_code == 401
        assert bad.get("/v1/status").status_code == 401
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/readyz").status_code == 200
        r = good.post("/run_code", json={"code": "print(1)", "language": "python"})
        assert r.status_code == 200 and r.json()["status"] == "Success"


def test_non_loopback_bind_needs_a_token() -> None:
    with pytest.raises(UsageError, match="token"):
        ServiceConfig(host="0.0.0.0")
    ServiceConfig(host="::1")  # loopback: fine without
    env = {k: v for k, v in os.environ.items() if k != "TRIALBOX_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "trialbox.cli", "serve", "--host", "0.0.0.0",
                          "--port", "0"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert "without a token" in out.stderr and "--token" in out.stderr


def test_non_loopback_with_token_starts(started: list[Server]) -> None:
    s = Server(host="0.0.0.0", token="long-random-token")
    started.append(s)
    port = s.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
        assert c.get("/v1/status").status_code == 401
        ok = c.get("/v1/status", headers={"Authorization": "Bearer long-random-token"})
        assert ok.status_code == 200


def test_oversized_request_413(started: list[Server]) -> None:
    s = Server("--max-body-mb", "0.01")  # 10 KiB
    started.append(s)
    with s.client() as c:
        big = base64.b64encode(os.urandom(16 << 10)).decode()
        r = c.post("/v1/exec", json={"code": "1", "files": {"f": big}})
        assert r.status_code == 413 and r.json()["error"] == "too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"code": "1", "files": {"f": "'
            for _ in range(8):
                yield b"A" * 4096
            yield b'"}}'
        r = c.post("/v1/exec", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        small = c.post("/v1/exec", json={"code": "print('small')"})
        assert small.json()["result"]["stdout"] == "small\n"


def test_rate_limit_429_with_retry_after(started: list[Server]) -> None:
    s = Server("--rate", "1", "--burst", "3")
    started.append(s)
    with s.client() as c:
        codes = [c.get("/v1/status").status_code for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and 429 in codes[3:], codes
        r = c.get("/v1/status")
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert c.get("/healthz").status_code == 200  # probes are never limited
        time.sleep(1.2)
        assert c.get("/v1/status").status_code == 200  # the bucket refills


def _post_async(c: httpx.Client, path: str, body: dict[str, Any],
                out: list[httpx.Response]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(c.post(path, json=body)))
    t.start()
    return t


def test_overload_503_with_retry_after_then_recovers(started: list[Server]) -> None:
    s = Server("--max-running", "1", "--max-queued", "1")
    started.append(s)
    slow = {"code": "import time; time.sleep(2); print('slept')", "language": "python"}
    with s.client() as a, s.client() as b, s.client() as c:
        first: list[httpx.Response] = []
        second: list[httpx.Response] = []
        t1 = _post_async(a, "/run_code", slow, first)
        assert wait_for(lambda: c.get("/v1/status").json()["admission"]["running"] == 1)
        t2 = _post_async(b, "/run_code", slow, second)
        assert wait_for(lambda: c.get("/v1/status").json()["admission"]["queued"] == 1)
        r = c.post("/run_code", json=slow)
        assert r.status_code == 503 and r.json()["error"] == "overloaded", r.text
        assert int(r.headers["Retry-After"]) >= 1
        t1.join()
        t2.join()
        assert [x.json()["run_result"]["stdout"] for x in first + second] == ["slept\n"] * 2
        status = c.get("/v1/status").json()
        assert status["counters"]["rejected"]["overload"] == 1
        assert c.post("/run_code", json={"code": "print(1)", "language": "python"}
                      ).json()["status"] == "Success"


def test_deadline_504_and_the_run_is_stopped(client: httpx.Client) -> None:
    sid = client.post("/v1/sessions", json={"limits": {"wall_s": 60, "cpu_s": 60}}
                      ).json()["session_id"]
    try:
        ticker = ("import time\ni = 0\nwhile True:\n    i += 1\n"
                  "    open('tick', 'w').write(str(i))\n    time.sleep(0.05)\n")
        t0 = time.monotonic()
        r = client.post(f"/v1/sessions/{sid}/run", json={"code": ticker},
                        headers={"X-Deadline-S": "1"})
        assert r.status_code == 504 and r.json()["error"] == "deadline", r.text
        # the 504 says the deadline, not the run's 60 s wall limit, ended it; that it did
        # so at its 1 s takes a wall bound, scaled by the host's load
        assert time.monotonic() - t0 < load_scaled(4)
        # Stopped, not left running: the file stops changing.
        first = client.get(f"/v1/sessions/{sid}/files/tick").json()["content_b64"]
        time.sleep(0.4)
        assert client.get(f"/v1/sessions/{sid}/files/tick").json()["content_b64"] == first
        # …and the session serves the next run at once.
        r = client.post(f"/v1/sessions/{sid}/exec", json={"argv": ["cat", "tick"]})
        assert r.json()["status"] == "ok"
        # One-shot runs too; a run shorter than its deadline is unaffected.
        r = client.post("/run_code", json={"code": "while True: pass", "language": "python",
                                           "run_timeout": 30}, headers={"X-Deadline-S": "1"})
        assert r.status_code == 504
        r = client.post("/run_code", json={"code": "print(1)", "language": "python"},
                        headers={"X-Deadline-S": "20"})
        assert r.status_code == 200
    finally:
        client.delete(f"/v1/sessions/{sid}")


def test_shutdown_closes_sessions_and_leaves_no_sandbox_process() -> None:
    s = Server()
    pid = s.proc.pid
    with s.client() as c:
        sid = c.post("/v1/sessions", json={}).json()["session_id"]
        c.post(f"/v1/sessions/{sid}/run", json={"code": "print(1)"})
        hold: list[httpx.Response] = []
        t = _post_async(c, "/v1/exec", {"code": "import time; time.sleep(1.5); print('ok')"},
                        hold)
        assert wait_for(lambda: httpx.get(f"{s.url}/v1/status").json()
                        ["admission"]["running"] == 1)
        assert pool_processes(pid)
        t0 = time.monotonic()
        s.stop()
        t.join()
        assert time.monotonic() - t0 < load_scaled(20)  # ends at all: a bound, load-scaled
        # Graceful: the request in flight was answered before the process went.
        assert hold and hold[0].json()["result"]["stdout"] == "ok\n"
    assert wait_for(lambda: not pool_processes(pid), 10), pool_processes(pid)


def test_busy_session_wait_counts_against_the_deadline(server: Server) -> None:
    with server.client() as a, server.client() as b:
        sid = a.post("/v1/sessions", json={}).json()["session_id"]
        try:
            first: list[httpx.Response] = []
            # the run stays in flight through the checks below; its wall limit well
            # above the nap (the default 10 s is not, once load_scaled stretches it)
            nap = min(load_scaled(2), 30.0)  # under the client's 60 s timeout
            t = _post_async(a, f"/v1/sessions/{sid}/run",
                            {"code": f"import time; time.sleep({nap}); print('first')",
                             "limits": {"wall_s": nap + 60, "cpu_s": 10}},
                            first)
            assert wait_for(lambda: b.get("/v1/status").json()["admission"]["running"] >= 1)
            # Reading the session does not wait for the run (that would take its nap).
            assert b.get(f"/v1/sessions/{sid}", timeout=nap / 2).json()["files"] == ["main.py"]
            r = b.post(f"/v1/sessions/{sid}/exec", json={"argv": ["true"]},
                       headers={"X-Deadline-S": "0.5"})
            assert r.status_code == 504 and "busy" in r.json()["message"], r.text
            t.join()
            assert first[0].json()["stdout"] == "first\n"  # the earlier run was untouched
        finally:
            a.delete(f"/v1/sessions/{sid}")


def test_failed_startup_is_a_clear_infra_exit() -> None:
    """Without root the sandbox pool cannot start: `serve` says so and exits 3 (the
    CLI's infrastructure status), listening on nothing."""
    # setpriv (util-linux): the venv's interpreter lies under /root, which a plain
    # setuid child could not even exec.
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, "-m", "trialbox.cli", "serve", "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "needs root" in out.stderr and "did not start" in out.stderr
    assert "listening" not in out.stdout


def test_names_the_server_answers_to(started: list[Server]) -> None:
    """Without a token: the bound address, localhost, ::1 and the names given with
    --allowed-host or TRIALBOX_ALLOWED_HOSTS (a reverse proxy's); a page of one of
    them may POST. With a token, the token is the guard and any name is served (a
    page cannot send it). Refusals: tests/adversarial/test_j_service.py."""
    s = Server("--allowed-host", "proxy.example",
               env={"TRIALBOX_ALLOWED_HOSTS": "ignored.example"})
    e = Server(env={"TRIALBOX_ALLOWED_HOSTS": "a.example, b.example"})
    t = Server(token="t0ken-456")
    started += [s, e, t]
    port = s.url.rsplit(":", 1)[1]
    with s.client() as c:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}",
                     "proxy.example", "PROXY.example:443"):
            assert c.get("/v1/status", headers={"Host": host}).status_code == 200, host
        r = c.post("/v1/exec", json={"code": "print(1)"},
                   headers={"Host": "proxy.example", "Origin": "https://proxy.example"})
        assert r.status_code == 200, r.text
        assert c.get("/v1/status", headers={"Host": "ignored.example"}).status_code == 403
    with e.client() as c:
        assert c.get("/v1/status", headers={"Host": "b.example"}).status_code == 200
    with t.client() as c:
        r = c.post("/v1/exec", json={"code": "print(1)"},
                   headers={"Host": "anything.example", "Origin": "http://other.example"})
        assert r.status_code == 200, r.text
