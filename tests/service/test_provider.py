"""The service takes a `SandboxProvider`, not a CellPool: the app served in-process on
`FakeProvider` (the layer above the sandbox interface, tested above a fake) — one-shot
runs lease their session through the scheduler and close it, sessions open from the
provider, and each request is a journaled task at the interactive tier."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from trialbox.sandbox.fake import FakeProvider
from trialbox.service.app import create_app
from trialbox.service.config import ServiceConfig
from trialbox.store.journal import Journal
from trialbox.types import ExecResult, ExecStatus


async def echo(argv: list[str], stdin: bytes, files: dict[str, bytes]) -> ExecResult:
    """'Runs' main.py by echoing its source, so the answer proves which file ran."""
    return ExecResult(ExecStatus.OK, exit_code=0, stdout=files.get("main.py", b"") + stdin,
                      tier="fake")


def test_app_serves_any_provider(tmp_path: Path) -> None:
    provider = FakeProvider(echo)
    journal = str(tmp_path / "service.db")
    app = create_app(ServiceConfig(journal=journal), provider=provider)
    # TestClient's default Host, `testserver`, is not a name of a server without a
    # token (403, docs/service.md Security): name one that is
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/readyz").json()["tier"] == "fake"
        r = client.post("/v1/exec", json={"code": "print(1)", "language": "python",
                                          "stdin": "!", "fetch_files": ["main.py"]})
        assert r.status_code == 200, r.text
        assert r.json()["result"]["stdout"] == "print(1)!"
        assert r.json()["result"]["tier"] == "fake"
        fused = client.post("/run_code", json={"code": "x", "language": "python"}).json()
        assert fused["status"] == "Success" and fused["run_result"]["stdout"] == "x"
        sid = client.post("/v1/sessions", json={}).json()["session_id"]
        run = client.post(f"/v1/sessions/{sid}/run", json={"code": "y"}).json()
        assert run["stdout"] == "y"
        status = client.get("/v1/status").json()
        assert status["pool"]["tier"] == "fake"
        run_id = status["admission"]["scheduler_run"]
        # grading takes its sandboxes from the same provider; one that runs nothing (it
        # echoes) yields no harness report, for the reference solution's control too:
        # excluded (error: the tests cannot run here; reward None), never scored 0
        g = client.post("/v1/submissions", json={"task_id": "HumanEval/0", "completion": "x"})
        assert g.status_code == 200, g.text
        assert g.json()["outcome"] in ("error", "infra") and g.json()["reward"] is None, \
            g.json()
        assert "the control failed too" in g.json()["message"]
    # one-shot sessions closed by the scheduler's lease; the session's closed at shutdown;
    # the judge's sandboxes (candidate and harness, attempt, retries and control) too
    assert len(provider.opened) > 3 and all(sb.closed for sb in provider.opened)
    with Journal(journal) as j:
        results = j.results_of(run_id)
        prio = {p for (p,) in j.conn.execute(
            "SELECT priority FROM tasks WHERE run_id=?", (run_id,))}
    assert {tid.split("-")[0] for tid in results} == {"exec", "run_code", "session",
                                                       "submission"}
    for tid, (state, _, reward, _) in results.items():  # the excluded grade: no reward
        assert (state, reward) == (("failed", None) if tid.startswith("submission")
                                   else ("done", 1.0)), (tid, state, reward)
    assert prio == {0}


def test_serve_from_the_gvisor_tier() -> None:
    """`trialbox serve --tier gvisor`: the same routes on another real tier (runsc)."""
    from tests.service.conftest import Server
    server = Server("--tier", "gvisor")
    try:
        with server.client() as c:
            assert c.get("/readyz").json()["tier"] == "gvisor"
            r = c.post("/run_code", json={"code": "print(input()[::-1])",
                                          "language": "python", "stdin": "olleh"}).json()
            assert r["status"] == "Success" and r["run_result"]["stdout"] == "hello\n", r
            bomb = c.post("/run_code", json={"code": "b = b'x' * (600 << 20)",
                                             "language": "python", "memory_limit_MB": 256})
            assert bomb.json()["run_result"]["trialbox_status"] == "memory", bomb.text
            status = c.get("/v1/status").json()
            assert status["pool"]["tier"] == "gvisor" and status["admission"]["admitted"] == 2
    finally:
        server.stop()
