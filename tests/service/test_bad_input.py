"""Bad input gets a 400/422 whose message names the field, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

BAD = [
    # (path, body, status, field)
    ("/v1/exec", {"code": "print(1)", "language": "cobol"}, 400, "language"),
    ("/run_code", {"code": "print(1)", "language": "cobol"}, 400, "language"),
    ("/v1/exec", {"code": "1", "files": {"a.bin": "%%not base64%%"}}, 422, "files.a.bin"),
    ("/run_code", {"code": "1", "language": "python", "files": {"a.bin": "@@"}}, 422,
     "files.a.bin"),
    ("/run_code", {"code": "1", "language": "python", "run_timeout": -1}, 422,
     "run_timeout"),
    ("/run_code", {"code": "1", "language": "python", "compile_timeout": -5}, 422,
     "compile_timeout"),
    ("/run_code", {"code": "1", "language": "python", "memory_limit_MB": 0}, 422,
     "memory_limit_MB"),
    ("/run_code", {"code": "1", "language": "python", "run_timeout": 10_000}, 422,
     "run_timeout"),
    ("/v1/exec", {"code": "1", "limits": {"wall_s": -2}}, 422, "limits.wall_s"),
    ("/v1/exec", {"code": "1", "limits": {"memory_mb": 1 << 20}}, 422, "limits.memory_mb"),
    ("/v1/exec", {"code": "1", "limits": {"memory_mb": 4}}, 422, "limits"),
    ("/v1/exec", {"code": "1", "limits": {"network": True}}, 422, "limits.network"),
    ("/v1/exec", {"language": "python"}, 422, "code"),
    ("/run_code", {"code": "1"}, 422, "language"),
    ("/v1/exec", {"code": "1", "stdin_b64": "!!"}, 422, "stdin_b64"),
    ("/v1/sessions", {"limits": {"pids": "many"}}, 422, "limits.pids"),
    ("/v1/submissions", {"task_id": "HumanEval/9999", "completion": "x"}, 422, "task_id"),
    ("/v1/submissions", {"completion": "x"}, 422, "task_id"),
    ("/v1/submissions", {"task": {"task_id": "t", "kind": "stdio", "prompt": "p",
                                  "tests": []}, "completion": "x"}, 422, "task"),
    ("/v1/submissions/batch", {"submissions": [
        {"task_id": "HumanEval/0", "completion": "x"},
        {"task_id": "nope", "completion": "x"}]}, 422, "submissions[1].task_id"),
]


@pytest.mark.parametrize(("path", "body", "status", "field"), BAD,
                         ids=[f"{p}:{f}" for p, _, _, f in BAD])
def test_bad_field_is_named(client: httpx.Client, path: str, body: dict[str, object],
                            status: int, field: str) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err.get("field") == field, err
    assert err["message"]


def test_malformed_json(client: httpx.Client) -> None:
    for path in ("/v1/exec", "/run_code", "/v1/submissions"):
        r = client.post(path, content=b'{"code": "print(1)",',
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"] == "bad_json", r.text
    r = client.post("/v1/exec", content=b"code=print(1)")  # no JSON at all
    assert r.status_code == 400 and "JSON" in r.json()["message"]
    r = client.post("/run_code", json=["not", "an", "object"])
    assert r.status_code == 422


def test_bad_deadline_header(client: httpx.Client) -> None:
    r = client.post("/v1/exec", json={"code": "1"}, headers={"X-Deadline-S": "-3"})
    assert r.status_code == 400 and r.json()["field"] == "X-Deadline-S"


def test_unknown_path_and_method(client: httpx.Client) -> None:
    assert client.get("/v1/nothing").status_code == 404
    assert client.get("/run_code").status_code == 405


def test_server_keeps_serving_after_bad_input(client: httpx.Client) -> None:
    for path, body, _, _ in BAD:
        client.post(path, json=body)
    client.post("/v1/exec", content=b"\xff\xfe garbage",
                headers={"Content-Type": "application/json"})
    assert client.get("/healthz").status_code == 200
    r = client.post("/run_code", json={"code": "print(2 + 2)", "language": "python"})
    assert r.json()["run_result"]["stdout"] == "4\n"
