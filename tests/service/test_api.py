"""Every native endpoint against the real server: health, one-shot runs, sessions and
their files, graded submissions (single and batch), status."""

from __future__ import annotations

import base64

import httpx

from trialbox.store.tasks import load_humaneval

HE = {t.task_id: t for t in load_humaneval()[:3]}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"


def test_one_shot_python_with_stdin_files_and_fetch(client: httpx.Client) -> None:
    code = ("import sys\ndata = open('in.txt').read()\n"
            "open('out.txt', 'w').write(data.upper() + sys.stdin.read())\nprint('done')\n")
    r = client.post("/v1/exec", json={"code": code, "stdin": "+stdin",
                                      "files": {"in.txt": b64(b"hello")},
                                      "fetch_files": ["out.txt", "missing.txt"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["result"]["status"] == "ok" and body["result"]["stdout"] == "done\n"
    assert base64.b64decode(body["files"]["out.txt"]) == b"HELLO+stdin"
    assert body["files"]["missing.txt"] is None


def test_one_shot_c_compiles_then_runs(client: httpx.Client) -> None:
    r = client.post("/v1/exec", json={"language": "c", "code":
                                      '#include <stdio.h>\nint main(){puts("c!");return 3;}'})
    res = r.json()["result"]
    assert res["status"] == "exit" and res["exit_code"] == 3 and res["stdout"] == "c!\n"
    assert res["compile"]["status"] == "ok"


def test_one_shot_limits_are_observed_from_outside(client: httpx.Client) -> None:
    r = client.post("/v1/exec", json={"code": "while True: pass",
                                      "limits": {"wall_s": 1, "cpu_s": 1}})
    assert r.json()["result"]["status"] == "timeout"
    r = client.post("/v1/exec", json={"code": "x = bytearray(400 << 20)",
                                      "limits": {"memory_mb": 64}})
    assert r.json()["result"]["status"] == "memory"


def test_session_lifecycle_files_persist_across_runs(client: httpx.Client) -> None:
    r = client.post("/v1/sessions", json={"limits": {"wall_s": 5, "memory_mb": 128}})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    assert r.json()["limits"]["memory_mb"] == 128
    try:
        up = client.put(f"/v1/sessions/{sid}/files", json={"files": {"lib.py":
                                                                    b64(b"X = 41\n")}})
        assert up.json()["written"] == ["lib.py"]
        run = client.post(f"/v1/sessions/{sid}/run", json={
            "code": "from lib import X\nopen('state.txt', 'w').write(str(X + 1))\n"})
        assert run.json()["status"] == "ok", run.text
        ex = client.post(f"/v1/sessions/{sid}/exec", json={"argv": ["cat", "state.txt"]})
        assert ex.json()["stdout"] == "42"
        got = client.get(f"/v1/sessions/{sid}/files/state.txt").json()
        assert base64.b64decode(got["content_b64"]) == b"42" and got["size"] == 2
        info = client.get(f"/v1/sessions/{sid}").json()
        assert info["files"] == ["lib.py", "main.py", "state.txt"] and info["runs"] == 2
        assert client.get(f"/v1/sessions/{sid}/files/nope.txt").status_code == 404
    finally:
        assert client.delete(f"/v1/sessions/{sid}").json()["closed"] is True
    gone = client.post(f"/v1/sessions/{sid}/exec", json={"argv": ["true"]})
    assert gone.status_code == 404 and gone.json()["error"] == "not_found"
    assert client.delete(f"/v1/sessions/{sid}").status_code == 404


def test_submission_graded_by_the_judge(client: httpx.Client) -> None:
    task = HE["HumanEval/0"]
    good = client.post("/v1/submissions", json={"task_id": task.task_id,
                                                "completion": task.canonical_solution})
    assert good.status_code == 200, good.text
    row = good.json()
    assert row["outcome"] == "passed" and row["reward"] == 1.0 and row["tests"]
    bad = client.post("/v1/submissions", json={"task_id": task.task_id,
                                               "completion": "    return False\n"}).json()
    assert bad["outcome"] == "failed" and bad["reward"] == 0.0
    # A candidate that prints the harness's success line gets nothing for it.
    cheat = client.post("/v1/submissions", json={
        "task_id": task.task_id,
        "completion": "    print('ALL TESTS PASSED'); raise SystemExit(0)\n"}).json()
    assert cheat["passed"] is False and cheat["reward"] == 0.0
    again = client.get(f"/v1/submissions/{row['submission_id']}").json()
    assert again == row
    recent = client.get("/v1/submissions", params={"limit": 3}).json()
    assert recent["submissions"][0]["submission_id"] == cheat["submission_id"]
    assert client.get("/v1/submissions/sub-404").status_code == 404


def test_submissions_survive_a_restart_with_records(tmp_path) -> None:
    """`serve --records DB`: graded rows are kept in the journal file, so a new server
    on the same file still answers `/v1/submissions/{id}`."""
    from tests.service.conftest import Server
    db = str(tmp_path / "records.db")
    task = HE["HumanEval/2"]
    first = Server("--records", db)
    try:
        with first.client() as c:
            row = c.post("/v1/submissions", json={"task_id": task.task_id,
                                                   "completion": task.canonical_solution}).json()
            assert row["outcome"] == "passed", row
    finally:
        first.stop()
    second = Server("--records", db)
    try:
        with second.client() as c:
            assert c.get(f"/v1/submissions/{row['submission_id']}").json() == row
            listed = c.get("/v1/submissions").json()["submissions"]
            assert [r["submission_id"] for r in listed] == [row["submission_id"]]
    finally:
        second.stop()


def test_inline_stdio_task_in_c(client: httpx.Client) -> None:
    task = {"task_id": "sum", "kind": "stdio", "prompt": "sum two ints",
            "compare": "whitespace",
            "tests": [{"stdin": "1 2\n", "expected": "3\n"},
                      {"stdin": "40 2\n", "expected": "42\n"}]}
    src = '#include <stdio.h>\nint main(){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);}'
    r = client.post("/v1/submissions", json={"task": task, "completion": src,
                                             "language": "c"})
    assert r.json()["outcome"] == "passed", r.text
    wrong = client.post("/v1/submissions", json={"task": task, "language": "python",
                                                 "completion": "print(3)"}).json()
    assert wrong["outcome"] == "failed" and wrong["pass_rate"] == 0.5


def test_batch_submission(client: httpx.Client) -> None:
    subs = [{"task_id": t.task_id, "completion": t.canonical_solution} for t in HE.values()]
    subs.append({"task_id": "HumanEval/1", "completion": "    return []\n"})
    r = client.post("/v1/submissions/batch", json={"submissions": subs})
    assert r.status_code == 200, r.text
    outcomes = [x["outcome"] for x in r.json()["results"]]
    assert outcomes == ["passed", "passed", "passed", "failed"]


def test_status_counts_what_happened(client: httpx.Client) -> None:
    before = client.get("/v1/status").json()
    client.post("/v1/exec", json={"code": "raise SystemExit(4)"})
    after = client.get("/v1/status").json()
    assert after["ready"] is True and after["admission"]["running"] == 0
    runs_b, runs_a = before["counters"]["runs"], after["counters"]["runs"]
    assert runs_a.get("exit", 0) == runs_b.get("exit", 0) + 1
    assert after["counters"]["requests"] >= before["counters"]["requests"] + 2
