"""Records over a real journal: a task's history, counts by state, slowest tasks, the
infra-failure rate; export to JSONL and Parquet through fsspec (a local directory and an
in-memory filesystem); the `trialbox tasks` commands."""

from __future__ import annotations

import asyncio
import io
import json

import pyarrow.parquet as pq
import pytest

from trialbox.cli import main as cli_main
from trialbox.errors import InfraError, UsageError
from trialbox.sandbox.fake import FakeSandbox
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.artifacts import ArtifactStore
from trialbox.store.export import export_run
from trialbox.store.records import Records
from trialbox.types import ExecStatus, Grade, Outcome, Turn


async def job(ctx: TaskContext) -> float | None:
    if ctx.task_id == "flaky" and ctx.attempt == 1:
        raise InfraError("cell died")
    if ctx.task_id == "slow":
        await asyncio.sleep(0.2)
    await ctx.record_turn(Turn("```python\nprint(1)\n```", (1, 2), (-0.5, -0.25),
                               code="print(1)", code_from="fenced",
                               exec_status=ExecStatus.OK, feedback_text="ok"))
    await ctx.record_turn({"plain": "dict", "bytes": b"\xff\x00"})
    await ctx.grading()
    await ctx.record_grade(Grade(ctx.task_id, Outcome.PASSED))
    return 1.0


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("rec") / "j.db")

    async def body():
        from trialbox.store.journal import Journal
        with Journal(path) as j:
            cfg = SchedulerConfig(capacity=Capacity(64, 1 << 20, 1 << 20), backoff_s=0.001,
                                  backoff_max_s=0.001)
            async with Scheduler(j, "run-1", job, cfg,
                                 opener=lambda lim: _fake(lim)) as s:
                await s.submit([TaskSpec("fast"), TaskSpec("slow"), TaskSpec("flaky"),
                                TaskSpec("HumanEval/0", payload={"k": 1})])
                await s.drain()
    asyncio.run(body())
    return path


async def _fake(limits):
    return FakeSandbox(limits=limits)


def test_queries(journal):
    with Records(journal) as r:
        assert r.runs() == ["run-1"]
        assert r.counts("run-1") == {"done": 4}
        (h,) = r.history("flaky")
        assert h.state == "done" and h.attempt == 2 and h.infra_failures == 1
        news = [t.new for t in h.transitions]
        assert news[:3] == ["pending", "queued", "generating"] and "retrying" in news
        assert h.result == {"attempt": 2, "state": "done", "reward": 1.0, "cause": ""}
        assert h.turns[0]["code"] == "print(1)" and h.turns[0]["exec_status"] == "ok"
        assert h.turns[1] == {"plain": "dict", "bytes": {"b64": "/wA="}}
        assert h.grades[2]["outcome"] == "passed"
        assert r.slowest("run-1", 1)[0][0] == "slow"
        assert r.infra_failure_rate("run-1") == pytest.approx(1 / 5)
        s = r.summary("run-1")
        assert s["tasks"] == 4 and s["final"] == 4 and s["mean_reward"] == 1.0


def test_export_jsonl_and_parquet(journal, tmp_path):
    local = ArtifactStore(str(tmp_path / "artifacts"))
    out = export_run(journal, "run-1", local, "jsonl")
    assert out["rows"] == 4
    rows = [json.loads(x) for x in local.get("run-1.trajectories.jsonl").splitlines()]
    assert {r["task_id"] for r in rows} == {"fast", "slow", "flaky", "HumanEval/0"}
    assert all(len(r["turns"]) == 2 and r["reward"] == 1.0 for r in rows)
    mem = ArtifactStore("memory://trialbox-test-export")
    out = export_run(journal, "run-1", mem, "parquet", name="data/run-1.parquet")
    assert out["path"].endswith("data/run-1.parquet") and mem.exists("data/run-1.parquet")
    table = pq.read_table(io.BytesIO(mem.get("data/run-1.parquet")))
    assert table.num_rows == 4 and set(table.column_names) >= {"task_id", "reward", "turns"}
    assert json.loads(table.column("turns")[0].as_py())[0]["code"] == "print(1)"
    assert mem.list("data") == ["data/run-1.parquet"]
    with pytest.raises(UsageError, match="format"):
        export_run(journal, "run-1", local, "csv")
    with pytest.raises(UsageError, match="no run"):
        export_run(journal, "nope", local, "jsonl")


def test_artifact_store_paths_and_atomic_local_writes(tmp_path):
    store = ArtifactStore(str(tmp_path / "a"))
    store.put("x/y.bin", b"1")
    store.put("x/y.bin", b"22")  # replaced, no temporary left behind
    assert store.get("x/y.bin") == b"22" and store.list() == ["x/y.bin"]
    with store.open("z.txt", "wb") as f:
        f.write(b"z")
    assert store.exists("z.txt")
    for bad in ("../escape", "", "a/../../b"):
        with pytest.raises(UsageError):
            store.put(bad, b"")
    with pytest.raises(UsageError, match="no artifact"):
        store.get("missing")


def test_tasks_cli(journal, capsys, tmp_path):
    assert cli_main(["tasks", "status", "run-1", "--db", journal]) == 0
    out = capsys.readouterr().out
    assert "run run-1: 4 tasks, 4 final" in out and "done" in out
    assert cli_main(["tasks", "status", "run-1", "--db", journal, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"done": 4}
    assert cli_main(["tasks", "show", "HumanEval/0", "--db", journal]) == 0
    out = capsys.readouterr().out
    assert "HumanEval/0 in run run-1: done, attempt 1" in out
    assert "queued -> generating" in " ".join(out.split())
    assert cli_main(["tasks", "show", "flaky", "--db", journal, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["infra_failures"] == 1
    assert cli_main(["tasks", "export", "run-1", "--db", journal, "--to",
                     str(tmp_path / "exp"), "--format", "parquet"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 4
    # bad input: exit 2 with what to change, 3 for an unreadable journal
    assert cli_main(["tasks", "status", "ghost", "--db", journal]) == 2
    assert "no run 'ghost'" in capsys.readouterr().err
    assert cli_main(["tasks", "show", "ghost", "--db", journal]) == 2
    assert cli_main(["tasks", "status", "r", "--db", str(tmp_path / "missing.db")]) == 2
    assert "no journal at" in capsys.readouterr().err
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 1000)
    assert cli_main(["tasks", "status", "r", "--db", str(bad)]) == 3
    assert "cannot be opened" in capsys.readouterr().err
