"""What a candidate does to its own session's workspace never makes the service fail:
trees too deep to list, names that are not UTF-8, a socket where a file is asked for
(issue 14, class D; before, each of these was a 500)."""

from __future__ import annotations

import httpx

HOSTILE = r"""
import os, socket
open(b'\xff\xfe.txt', 'wb').close()
socket.socket(socket.AF_UNIX).bind('sock')
os.mkdir('main.dir')
os.chdir('main.dir')
for _ in range(1100):
    os.mkdir('d')
    os.chdir('d')
"""


def test_a_hostile_workspace_gives_clear_answers(client: httpx.Client) -> None:
    r = client.post("/v1/sessions", json={"limits": {"wall_s": 10, "memory_mb": 128}})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    try:
        run = client.post(f"/v1/sessions/{sid}/run", json={"code": HOSTILE})
        assert run.status_code == 200 and run.json()["status"] == "ok", run.text
        info = client.get(f"/v1/sessions/{sid}")
        assert info.status_code == 200, info.text
        body = info.json()
        assert body["files"] is None and "too deep" in body["files_error"], body
        sock = client.get(f"/v1/sessions/{sid}/files/sock")
        assert sock.status_code == 404 and "cannot be read" in sock.json()["message"], \
            sock.text
        # with the deep tree gone, the odd name is listed, escaped
        run = client.post(f"/v1/sessions/{sid}/exec",
                          json={"argv": ["rm", "-rf", "main.dir"]})
        assert run.status_code == 200 and run.json()["status"] == "ok", run.text
        files = client.get(f"/v1/sessions/{sid}").json()["files"]
        assert "\\xff\\xfe.txt" in files and "sock" in files, files
    finally:
        client.delete(f"/v1/sessions/{sid}")
