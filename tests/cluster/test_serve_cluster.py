"""`trialbox serve --backend ray` on a real Ray cluster on this machine: `/run_code` and
`/v1/sessions` run on the nodes (the server process keeps no sandbox pool), give what
the local server gives, and a node killed under the server costs a one-shot nothing (it
runs again on another node) and a session a clear infrastructure error.

The servers are real processes (`trialbox serve --port 0`) spoken to over HTTP. The
head offers the namespace tier; the test of a killed node adds a node of its own."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.cluster.test_ray_cluster import (  # noqa: E402
    ROOT,
    nid,
    node_resources,
    wait_all_nodes_free,
    wait_dead,
)
from tests.service.conftest import LISTENING, Server, pool_processes  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
# `cluster`: the shared one (tests/cluster/conftest.py), its head offering namespace


class RayServer:
    """`trialbox serve --backend ray --address <cluster>` in its own process."""

    def __init__(self, cluster: Cluster):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="trialbox-serve-ray-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trialbox.cli", "serve", "--port", "0", "--warm", "1",
             "--backend", "ray", "--address", cluster.address], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=self.log,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.url = ""
        self.said: list[str] = []

    def wait(self) -> RayServer:
        assert self.proc.stdout is not None
        while not self.url:
            line = self.proc.stdout.readline()
            if not line:
                self.log.seek(0)
                raise RuntimeError(f"server did not start: {self.said} {self.log.read()}")
            self.said.append(line)
            if line.startswith(LISTENING):
                self.url = line[len(LISTENING):].strip()
        return self

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120)

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.seek(0)
        err = self.log.read()[-3000:]
        self.log.close()
        return self.proc.returncode, err


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def seen(response: dict[str, Any]) -> dict[str, Any]:
    """A /run_code answer less what differs run to run (times, memory peaks)."""
    out = dict(response)
    for key in ("run_result", "compile_result"):
        if out.get(key):
            out[key] = {k: v for k, v in out[key].items()
                        if k not in ("execution_time", "cpu_time", "peak_memory_bytes")}
    return out


RUNS: list[dict[str, Any]] = [
    {"code": "print(input()[::-1])", "language": "python", "stdin": "hello\n"},
    {"code": "import sys; sys.stderr.write('bad\\n'); sys.exit(3)", "language": "python"},
    {"code": "while True: pass", "language": "python", "run_timeout": 1},
    {"code": "print(open('in.txt').read().upper()); open('out.txt', 'w').write('made')",
     "language": "python", "files": {"in.txt": b64(b"from the client")},
     "fetch_files": ["out.txt", "never.txt"]},
    {"code": "#include <stdio.h>\nint main(void) { puts(\"compiled\"); return 2; }\n",
     "language": "c"},
]

TURN_1 = "n = int(open('data.txt').read()); open('state.txt', 'w').write(str(n + 1)); " \
         "print(n + 1)"
TURN_2 = "print(open('state.txt').read())"


def session_turns(c: httpx.Client) -> tuple[str, list[dict[str, Any]]]:
    """A session's files persist across calls: upload, run, run again, download."""
    sid = c.post("/v1/sessions", json={}).json()["session_id"]
    assert c.put(f"/v1/sessions/{sid}/files",
                 json={"files": {"data.txt": b64(b"41")}}).status_code == 200
    out = []
    for code in (TURN_1, TURN_2):
        r = c.post(f"/v1/sessions/{sid}/run", json={"code": code, "language": "python"})
        assert r.status_code == 200, r.text
        out.append({k: r.json()[k] for k in ("status", "exit_code", "stdout", "stderr")})
    assert c.get(f"/v1/sessions/{sid}/files/state.txt").json()["content_b64"] == b64(b"42")
    return sid, out


def test_run_code_and_sessions_run_on_a_node_as_they_do_locally(cluster: Cluster) -> None:
    head = nid(cluster.head_node)
    assert wait_all_nodes_free()
    remote = RayServer(cluster)
    local = Server()  # the same server on this machine's own pool, side by side
    try:
        remote.wait()
        assert "grading on 1 Ray node(s)" in remote.said[0], remote.said
        with local.client() as lc, remote.client() as rc:
            t0 = time.monotonic()
            for body in RUNS:
                want = lc.post("/run_code", json=body)
                got = rc.post("/run_code", json=body)
                assert got.status_code == want.status_code == 200, got.text
                assert seen(got.json()) == seen(want.json()), body
            print(f"{len(RUNS)} /run_code on the node: {time.monotonic() - t0:.2f} s")
            # (and those are the runs meant: every outcome, not, say, all infra)
            answers = [rc.post("/run_code", json=b).json() for b in RUNS[:4]]
            assert [a["run_result"]["trialbox_status"] for a in answers] == [
                "ok", "exit", "timeout", "ok"]
            assert answers[0]["run_result"]["stdout"] == "olleh\n"
            assert answers[3]["run_result"]["stdout"] == "FROM THE CLIENT\n"
            assert answers[3]["files"] == {"out.txt": b64(b"made")}

            _, local_turns = session_turns(lc)
            sid, turns = session_turns(rc)
            assert turns == local_turns
            assert [t["stdout"] for t in turns] == ["42\n", "42\n"]
            session = rc.get(f"/v1/sessions/{sid}").json()
            assert session["node"] == head and session["files"] == [
                "data.txt", "main.py", "state.txt"]
            status = rc.get("/v1/status").json()
            pool = status["pool"]
            # every sandbox was the node's: the one-shots' sessions and this one
            assert pool["backend"] == "ray" and list(pool["nodes"]) == [head]
            assert pool["nodes"][head]["sessions"] == 1 == pool["sessions_open"]
            assert pool["sessions_opened"] == len(RUNS) + 4 + 1
            assert pool["nodes"][head]["placed"] == status["grading"]["placed"] > 20
            # and none was this machine's: the server process started no pool
            assert pool_processes(remote.proc.pid) == []
            assert status["counters"]["runs"]["ok"] >= 4
            assert rc.delete(f"/v1/sessions/{sid}").json()["closed"] is True
    finally:
        local.stop()
        code, err = remote.stop()
    assert code == 0, err
    assert wait_all_nodes_free()  # the server's node actor is gone with it


def test_a_node_killed_under_the_server(cluster: Cluster) -> None:
    """A raylet killed (`remove_node(allow_graceful=False)`) while a one-shot runs on it
    and a session lives there: the one-shot is answered once, by another node; the
    session's calls answer 503 `infra` naming the node; the other node's session and
    the server go on."""
    head = nid(cluster.head_node)
    assert wait_all_nodes_free()
    k = cluster.add_node(num_cpus=1, resources=node_resources(2, "namespace"))
    server = RayServer(cluster)
    answer: list[httpx.Response] = []
    killed = False
    try:
        server.wait()
        assert "grading on 2 Ray node(s)" in server.said[0], server.said
        with server.client() as c:
            on: dict[str, str] = {}
            for _ in range(4):  # the placer spreads new sessions: one per node
                sid = c.post("/v1/sessions", json={}).json()["session_id"]
                on.setdefault(c.get(f"/v1/sessions/{sid}").json()["node"], sid)
                if len(on) == 2:
                    break
            assert set(on) == {head, nid(k)}, on
            for sid in on.values():
                assert c.put(f"/v1/sessions/{sid}/files",
                             json={"files": {"data.txt": b64(b"41")}}).status_code == 200
            r = c.post(f"/v1/sessions/{on[head]}/run", json={"code": TURN_1,
                                                            "language": "python"})
            assert r.json()["stdout"] == "42\n"
            # the head was used last: the next one-shot goes to k (least recently used)
            slow = {"code": "import time; time.sleep(4); print('done')",
                    "language": "python", "run_timeout": 30}

            def one_shot() -> None:
                with server.client() as c2:
                    answer.append(c2.post("/run_code", json=slow))
            t = threading.Thread(target=one_shot)
            t.start()
            deadline = time.monotonic() + 60
            while True:
                node = c.get("/v1/status").json()["pool"]["nodes"][nid(k)]
                if node["sessions"] == 2 and node["in_flight"] >= 1:
                    break  # the one-shot's session is on k, a call of it running
                assert time.monotonic() < deadline and t.is_alive(), (node, answer)
                time.sleep(0.05)
            t_kill = time.monotonic()
            cluster.remove_node(k, allow_graceful=False)
            killed = True
            t.join(timeout=120)
            [r] = answer
            # exactly one answer, the run's own: made again on the head, start to end
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "Success" and r.json()["run_result"][
                "stdout"] == "done\n", r.json()
            print(f"one-shot answered {time.monotonic() - t_kill:.1f} s after the kill")
            status = c.get("/v1/status").json()
            assert status["counters"]["replaced"] == 1
            assert status["grading"]["nodes_lost"] == 1
            assert list(status["pool"]["nodes"]) == [head]
            assert status["pool"]["nodes_lost"] == [nid(k)]
            # k's session: a clear infrastructure error, never a run's outcome
            for _ in range(2):
                r = c.post(f"/v1/sessions/{on[nid(k)]}/run",
                           json={"code": TURN_2, "language": "python"})
                assert r.status_code == 503 and r.json()["error"] == "infra", r.text
                msg = r.json()["message"]
                assert f"lived on cluster node {nid(k)}, which was lost" in msg, msg
                assert "Open a new session (POST /v1/sessions)" in msg, msg
            assert c.delete(f"/v1/sessions/{on[nid(k)]}").json()["closed"] is True
            # the head's session goes on, its files intact
            r = c.post(f"/v1/sessions/{on[head]}/run", json={"code": TURN_2,
                                                            "language": "python"})
            assert r.status_code == 200 and r.json()["stdout"] == "42\n", r.text
            counters = c.get("/v1/status").json()["counters"]
            assert counters["sessions_lost"] == 1
            assert "infra" not in counters["runs"], counters
    finally:
        code, err = server.stop()
        if not killed:
            cluster.remove_node(k, allow_graceful=False)
    wait_dead(k)
    assert code == 0, err
