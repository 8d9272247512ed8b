"""J: the service (issue 28, class 5; and `list_files` of class 6). Each attack against a
real `trialbox serve` on a socket: forged notebook results, DNS rebinding, a rate limit
re-spelled or flooded, slow clients, one client holding every session, a body past the
limit, a kernel uevent socket, file names that are not UTF-8."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import load_scaled
from tests.service.conftest import Server, wait_for


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server("--max-sessions", "4", "--max-sessions-per-client", "2",
               "--read-timeout-s", "1", "--max-body-mb", "1")
    yield s
    s.stop()


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


# ------------------------------------------------------------------ /run_jupyter forgeries

FORGERIES = {
    # the records file the driver used to write, filled ahead for every cell
    "results_file": """
import json, os
os.makedirs('.jupyter', exist_ok=True)
with open('.jupyter/cells.jsonl', 'w') as f:
    for i in range(3):
        f.write(json.dumps({"cell": i, "stdout": "", "stderr": "", "display": [],
                            "error": [], "timed_out": False}) + "\\n")
    f.write(json.dumps({"done": 3}) + "\\n")
os._exit(0)
""",
    # answers written ahead on every fd the kernel holds (its reply pipe among them)
    "reply_pipe": """
import json, os
for fd in range(3, 64):
    for i in range(1, 3):
        try:
            os.write(fd, (json.dumps({"token": "0" * 32, "stdout": "", "stderr": "",
                "display": [], "error": [], "timed_out": False}) + "\\n").encode())
        except OSError:
            pass
os._exit(0)
""",
    # the driver's own fds, through /proc (it is undumpable), and the driver killed
    "driver_fds": """
import json, os, signal
rec = "".join(json.dumps({"cell": i, "stdout": "", "stderr": "", "display": [],
                          "error": [], "timed_out": False}) + "\\n" for i in range(3))
rec += json.dumps({"done": 3}) + "\\n"
for fd in range(0, 64):
    try:
        w = os.open(f"/proc/{os.getppid()}/fd/{fd}", os.O_WRONLY)
        os.write(w, rec.encode())
    except OSError:
        pass
print(rec, end="", flush=True)
os.write(1, rec.encode())
os.kill(os.getppid(), signal.SIGKILL)
os._exit(0)
""",
}


SHADOW = FORGERIES["results_file"].replace("os._exit(0)", """
for fd in range(3, 64):
    try:
        os.write(fd, open('.jupyter/cells.jsonl', 'rb').read())
    except OSError:
        pass
os._exit(0)
""")
"""A `json.py` uploaded as `.jupyter/json.py`, beside the driver: whoever imports it
writes the records everywhere it can and leaves."""


@pytest.mark.parametrize("attack", [*sorted(FORGERIES), "shadowed_module"])
def test_a_first_cell_cannot_forge_later_cells(server: Server, attack: str) -> None:
    """A grader's test cells appended after the candidate's: cell 0 (or a module the
    request uploaded) forges records and leaves. The test cell (which would fail) must
    not show as run — before, with `results_file` and `shadowed_module`, the notebook
    was `Success` with every cell clean."""
    first = FORGERIES.get(attack, "x = 1")
    files = ({".jupyter/json.py": base64.b64encode(SHADOW.encode()).decode()}
             if attack == "shadowed_module" else {})
    cells = [first, "def answer():\n    return 41", "assert answer() == 42"]
    with server.client() as c:
        r = c.post("/run_jupyter", json={"cells": cells, "total_timeout": 20,
                                         "files": files})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "Failed", body
    assert len(body["cells"]) < len(cells), body["cells"]
    assert "program's own report" in body["trust"]


def test_the_kernel_cannot_reach_the_driver(server: Server) -> None:
    """The driver's process is out of the kernel's reach: its /proc/<pid>/fd, mem and
    environ cannot be opened (it is undumpable), so neither its record channel nor
    its memory can be."""
    probe = """
import os
p = os.getppid()
out = {}
for what in ("fd", "mem", "environ"):
    try:
        os.listdir(f"/proc/{p}/fd") if what == "fd" else open(f"/proc/{p}/{what}", "rb")
        out[what] = "open"
    except OSError as e:
        out[what] = type(e).__name__
out
"""
    with server.client() as c:
        r = c.post("/run_jupyter", json={"cells": [probe], "total_timeout": 20})
    body = r.json()
    assert body["status"] == "Success", body
    seen = eval(body["cells"][0]["display"][0]["text/plain"])  # a dict's repr
    assert "open" not in seen.values(), seen


# ------------------------------------------------------------------ DNS rebinding

def test_dns_rebinding_host_and_origin_are_refused(server: Server) -> None:
    """A page at http://attacker.example whose name now resolves to 127.0.0.1: its
    requests carry Host: attacker.example (and Origin on a POST). Refused with 403
    saying what to change; before, every one was served."""
    port = _port(server)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for method, path, body in (("GET", "/v1/status", None),
                                   ("POST", "/v1/exec", {"code": "print(1)"}),
                                   ("GET", "/api/review/queue", None)):
            r = c.request(method, path, json=body,
                          headers={"Host": f"attacker.example:{port}"})
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"] == "host_not_allowed"
            assert "--allowed-host" in r.json()["message"]
        # the rebinding page may also reach us as 127.0.0.1 with its own Origin
        for origin in ("http://attacker.example", "null", f"http://localhost:{port + 1}"):
            r = c.post("/v1/exec", json={"code": "print(1)"}, headers={"Origin": origin})
            assert r.status_code == 403 and r.json()["error"] == "origin_not_allowed", \
                (origin, r.text)
        # ordinary clients: no Origin, or this server's own pages
        ok = c.post("/v1/exec", json={"code": "print(1)"},
                    headers={"Origin": f"http://127.0.0.1:{port}"})
        assert ok.status_code == 200, ok.text
        assert c.get("/v1/status", headers={"Origin": "http://attacker.example"}
                     ).status_code == 200  # a read's answer is the browser's to withhold


# ------------------------------------------------------------------ rate limit

def test_the_rate_limit_cannot_be_respelled_or_flooded() -> None:
    """Before, the bucket was keyed on the raw Authorization header: `Bearer`
    re-spelled got a fresh bucket per spelling, and without a token every header value
    was a new bucket (10,000 of them cleared everyone's: guard.RateLimiter's own test
    is in tests/service/test_units.py); and uvicorn took the client's address from
    X-Forwarded-For on any connection from 127.0.0.1, so a local client named itself."""
    for token in ("t0ken-xyz", None):
        s = Server("--rate", "0.01", "--burst", "3", token=token)
        try:
            spellings = (["Bearer t0ken-xyz", "bearer t0ken-xyz", "BEARER  t0ken-xyz",
                          "Bearer   t0ken-xyz", "bEaReR t0ken-xyz"] if token else
                         [f"Bearer x{i}" for i in range(5)])
            with httpx.Client(base_url=s.url, timeout=30) as c:
                codes = [c.get("/v1/status", headers={"Authorization": h}).status_code
                         for h in spellings]
                assert codes[:3] == [200] * 3 and codes[3:] == [429, 429], (token, codes)
                if token is None:
                    codes = [c.get("/v1/status", headers={"Authorization": f"Bearer f{i}"}
                                   ).status_code for i in range(300)]
                    codes += [c.get("/v1/status", headers={
                        "X-Forwarded-For": f"10.0.0.{i}", "Forwarded": f"for=10.1.0.{i}",
                        "X-Real-IP": f"10.2.0.{i}"}).status_code for i in range(5)]
                    assert set(codes) == {429}, codes
        finally:
            s.stop()


# ------------------------------------------------------------------ slow clients

def test_slowloris_headers_and_body_do_not_hold_the_server(server: Server) -> None:
    """Headers sent a byte at a time, a connection that sends nothing, a body that
    stalls: each ends within the server's read timeout (1 s here), not at the client's
    pleasure. Before, the first two were held as long as the client liked."""
    port = _port(server)

    def closed_by_server(first: bytes, trickle: bytes) -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=load_scaled(20)) as s:
            s.sendall(first)
            end = time.monotonic() + load_scaled(20)
            for b in trickle:
                if time.monotonic() > end:
                    return False
                try:
                    s.sendall(bytes([b]))
                except OSError:  # reset: closed by the server
                    return True
                time.sleep(0.2)
            s.settimeout(load_scaled(10))
            try:
                return s.recv(100) == b""
            except TimeoutError:  # still open, waiting for more of the request
                return False
            except OSError:  # reset: closed by the server
                return True

    head = b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200
    assert closed_by_server(b"", head)
    assert closed_by_server(b"", b"")
    # a body that stops: 408 after the read timeout
    with socket.create_connection(("127.0.0.1", port), timeout=load_scaled(20)) as s:
        s.sendall(b"POST /v1/exec HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 100\r\n\r\n{\"code\": ")
        answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer
    with server.client() as c:  # the server still serves
        assert c.get("/v1/status").status_code == 200


# ------------------------------------------------------------------ sessions per client

def test_one_client_cannot_hold_every_session(server: Server) -> None:
    """--max-sessions 4, --max-sessions-per-client 2: a third session from one client
    is refused (429 naming the cap), another client (another address) still opens
    one. Before, one client could open all 4."""
    opened: list[tuple[httpx.Client, str]] = []
    with server.client() as a, server.client(
            transport=httpx.HTTPTransport(local_address="127.0.0.2")) as b:
        try:
            for _ in range(2):
                r = a.post("/v1/sessions", json={})
                assert r.status_code == 201, r.text
                opened.append((a, r.json()["session_id"]))
            r = a.post("/v1/sessions", json={})
            assert r.status_code == 429 and r.json()["error"] == "client_limit", r.text
            assert "DELETE" in r.json()["message"] and "Retry-After" in r.headers
            r = b.post("/v1/sessions", json={})
            assert r.status_code == 201, r.text
            opened.append((b, r.json()["session_id"]))
        finally:
            for c, sid in opened:
                c.delete(f"/v1/sessions/{sid}")


# ------------------------------------------------------------------ bodies past the limit

def test_a_body_past_the_limit_is_refused_unread(server: Server) -> None:
    """Content-Length past --max-body-mb (1 MiB here): 413 at once, before any of the
    body is sent, and the connection closed (recv ends)."""
    with socket.create_connection(("127.0.0.1", _port(server)),
                                  timeout=load_scaled(20)) as s:
        s.sendall(b"POST /v1/exec HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % (3 << 19))
        answer = b""
        try:
            while True:  # the answer comes with none of the body sent
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
        assert answer.startswith(b"HTTP/1.1 413"), answer
        assert b'"too_large"' in answer and b"connection: close" in answer.lower()


# ------------------------------------------------------------------ uevent sockets

UEVENT = """
import json, select, socket
out = {}
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15)  # NETLINK_KOBJECT_UEVENT
    s.bind((0, 1))
    open("ready", "w").close()
    ready, _, _ = select.select([s], [], [], 6)
    out["event"] = s.recv(4096)[:60].decode(errors="replace") if ready else None
except OSError as e:
    open("ready", "w").close()
    out["refused"] = type(e).__name__
print(json.dumps(out))
"""


def test_a_uevent_socket_sees_nothing_of_the_host(server: Server) -> None:
    """A program listening on NETLINK_KOBJECT_UEVENT while the host sees a device
    event (here: `change` written to /dev/null's uevent) must get nothing. Before
    df08dc6 (seccomp now refuses such sockets) it read `change@/devices/virtual/mem/
    null`: the sandbox's network namespace is owned by the host's user namespace."""
    with server.client() as c:
        sid = c.post("/v1/sessions", json={"limits": {"wall_s": 30}}).json()["session_id"]
        try:
            out: list[httpx.Response] = []
            t = threading.Thread(target=lambda: out.append(c.post(
                f"/v1/sessions/{sid}/run", json={"code": UEVENT})))
            t.start()
            try:
                assert wait_for(lambda: "ready" in (httpx.get(
                    f"{server.url}/v1/sessions/{sid}").json().get("files") or []), 20)
                with open("/sys/devices/virtual/mem/null/uevent", "w") as f:
                    f.write("change")
            finally:
                t.join()
            seen = json.loads(out[0].json()["stdout"])
            assert seen.get("event") is None, seen
        finally:
            c.delete(f"/v1/sessions/{sid}")


# ------------------------------------------------------------------ names not UTF-8

def test_names_that_are_not_utf8_cross_and_come_back(server: Server) -> None:
    """`bad-\\xff.txt`: listed escaped and said to be (`files_escaped`, with its
    bytes), and the escaped form read back by the file endpoints. Before, the name
    had no flag and the escaped form was a 404."""
    code = "open(b'bad-\\xff.txt', 'wb').write(b'odd'); open('good.txt', 'w').write('ok')"
    with server.client() as c:
        sid = c.post("/v1/sessions", json={}).json()["session_id"]
        try:
            assert c.post(f"/v1/sessions/{sid}/run", json={"code": code}
                          ).json()["status"] == "ok"
            info = c.get(f"/v1/sessions/{sid}").json()
            assert "bad-\\xff.txt" in info["files"] and "good.txt" in info["files"], info
            assert info["files_escaped"] == [{
                "name": "bad-\\xff.txt",
                "name_b64": base64.b64encode(b"bad-\xff.txt").decode()}]
            got = c.get(f"/v1/sessions/{sid}/files/bad-\\xff.txt")
            assert got.status_code == 200, got.text
            assert base64.b64decode(got.json()["content_b64"]) == b"odd"
        finally:
            c.delete(f"/v1/sessions/{sid}")
        r = c.post("/v1/exec", json={"code": code, "fetch_files": ["bad-\\xff.txt"]})
        assert base64.b64decode(r.json()["files"]["bad-\\xff.txt"]) == b"odd", r.text
