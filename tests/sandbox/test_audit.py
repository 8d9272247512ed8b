"""The audit log (audit.py): the wrapper over the fake provider for the record's shape,
queries and bad input; over the real namespace tier for limit hits and the runtime id."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Runner, eventually
from trialbox.errors import UsageError
from trialbox.sandbox import PoolConfig
from trialbox.sandbox.audit import (AuditConfig, AuditLog, audit_task, audited, query,
                                    read)
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.fake import FakeProvider
from trialbox.types import ExecResult, ExecStatus, Limits


async def _echo(argv: list[str], stdin: bytes, files: dict[str, bytes]) -> ExecResult:
    if argv[0] == "sleep":
        return ExecResult(ExecStatus.TIMEOUT, signal=9, message="wall clock", tier="fake")
    if argv[0] == "boom":
        raise RuntimeError("machinery broke")
    return ExecResult(ExecStatus.OK, exit_code=0, stdout=stdin * 2, stderr=b"e",
                      wall_ms=1.5, tier="fake")


def test_a_session_is_one_line_with_who_what_when(tmp_path: Path) -> None:
    path = str(tmp_path / "audit.jsonl")
    log = AuditLog(AuditConfig(path, who="tester", max_arg_chars=8))
    provider = audited(FakeProvider(_echo), log)
    assert isinstance(provider, SandboxProvider) and provider.tier == "fake"

    async def body() -> None:
        with audit_task("T/1"):
            async with await provider.open(Limits(wall_s=2)) as sb:
                await sb.write_file("main.py", b"x" * 10)
                await sb.exec(["python3", "-c", "print('a long program')"], stdin=b"abc")
                await sb.exec(["sleep", "9"], limits=Limits(wall_s=1))
                with pytest.raises(RuntimeError):
                    await sb.exec(["boom"])
                assert await sb.read_file("main.py") == b"x" * 10
        async with await provider.open() as sb:  # outside audit_task: no task id
            await sb.exec(["true"])

    asyncio.run(body())
    log.close()
    lines = Path(path).read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)
    first, second = read(path)
    assert (first.who, first.task_id, first.tier, first.runtime) == \
        ("tester", "T/1", "fake", "fake")
    assert first.limits["wall_s"] == 2 and first.closed and first.closed_at >= first.opened_at
    ok, timeout, error = first.commands
    assert ok.argv == ("python3", "-c", "print('a") and ok.argv_chars == (7, 2, 23)
    assert (ok.status, ok.exit_code, ok.stdin_bytes, ok.stdout_bytes, ok.stderr_bytes) == \
        ("ok", 0, 3, 6, 1)
    assert (timeout.status, timeout.limit, timeout.signal) == ("timeout", "timeout", 9)
    assert timeout.limits is not None and timeout.limits["wall_s"] == 1
    assert error.status == "error" and error.error == "RuntimeError: machinery broke"
    assert (first.files_written, first.files_read) == (1, 1)
    assert (first.bytes_in, first.bytes_out) == (10 + 3, 10 + 6 + 1)
    assert first.limit_hits == {"timeout": 1}
    assert second.task_id == "" and second.session != first.session
    assert [s.session for s in query(path, task="T/1", status="timeout")] == [first.session]
    assert query(path, status="timeout", tier="namespace") == []
    assert [s.session for s in query(path, status="ok")] == [first.session, second.session]


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="AuditConfig.path"):
        AuditConfig("")
    with pytest.raises(UsageError, match="writable file"):
        AuditLog(AuditConfig(str(tmp_path / "no" / "such" / "dir.jsonl")))
    with pytest.raises(UsageError, match="unknown status 'slow'"):
        query(str(tmp_path / "x"), status="slow")
    (tmp_path / "bad.jsonl").write_text('{"not": "a record"}\n')
    with pytest.raises(UsageError, match="bad.jsonl:1 is not an audit record"):
        query(str(tmp_path / "bad.jsonl"))
    with pytest.raises(UsageError, match="takes an AuditLog"):
        audited(FakeProvider(), "audit.jsonl")  # type: ignore[arg-type]
    assert isinstance(audited(FakeProvider(), None), FakeProvider)  # off: untouched


def test_a_session_left_open_is_written_at_close(tmp_path: Path) -> None:
    path = str(tmp_path / "a.jsonl")
    log = AuditLog(AuditConfig(path))
    provider = audited(FakeProvider(), log)

    async def body() -> None:
        sb = await provider.open()
        await sb.exec(["true"])

    asyncio.run(body())
    assert log.written == 0
    log.close()
    (s,) = read(path)
    assert not s.closed and [c.status for c in s.commands] == ["ok"]
    with pytest.raises(UsageError, match="audit log is closed"):
        asyncio.run(provider.open())


def test_the_writer_flushes_without_close(tmp_path: Path) -> None:
    """Records reach the file while the log stays open (a long-running service)."""
    path = str(tmp_path / "a.jsonl")
    log = AuditLog(AuditConfig(path, flush_s=0.05))
    provider = audited(FakeProvider(), log)

    async def body() -> None:
        for _ in range(3):
            async with await provider.open() as sb:
                await sb.exec(["true"])
        await eventually(lambda: log.written == 3, 2)

    asyncio.run(body())
    assert len(read_lines := Path(path).read_text().splitlines()) == 3, read_lines
    log.close()


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    r = Runner(PoolConfig(warm=1))
    yield r
    r.close()


def test_namespace_tier_limit_hits_are_recorded(runner: Runner, tmp_path: Path) -> None:
    path = str(tmp_path / "ns.jsonl")
    with AuditLog(AuditConfig(path)) as log:
        provider = audited(runner.pool, log)

        async def body() -> None:
            with audit_task("ns/1"):
                async with await provider.open(Limits(wall_s=1, cpu_s=1, memory_mb=64,
                                                      disk_mb=16)) as sb:
                    assert (await sb.exec(["/bin/true"])).ok
                    await sb.exec(["python3", "-c", "while True: pass"])
                    await sb.exec(["python3", "-c", "b = bytearray(200 << 20); print(1)"])
                    await sb.exec(["sh", "-c", "exit 3"])

        runner.run(body())
    (s,) = query(path, task="ns/1")
    assert s.tier == "namespace" and s.runtime == runner.pool.runtime.id
    assert "@sha256:" in s.runtime
    assert [c.status for c in s.commands] == ["ok", "timeout", "memory", "exit"]
    assert s.commands[3].exit_code == 3
    assert s.limit_hits == {"timeout": 1, "memory": 1}
    assert all(c.wall_ms > 0 for c in s.commands)
    assert query(path, status="memory") == [s]


def test_cli_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trialbox.cli import main
    path = str(tmp_path / "a.jsonl")
    with AuditLog(AuditConfig(path)) as log:
        provider = audited(FakeProvider(_echo), log)

        async def body() -> None:
            for task, argv in (("a", ["true"]), ("b", ["sleep", "1"]), ("b", ["true"])):
                with audit_task(task):
                    async with await provider.open() as sb:
                        await sb.exec(argv)

        asyncio.run(body())
    assert main(["audit-log", "query", "--file", path, "--task", "b", "--count"]) == 0
    assert capsys.readouterr().out == "2\n"
    assert main(["audit-log", "query", "--file", path, "--status", "timeout"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["task_id"] == "b"
    assert main(["audit-log", "query", "--file", str(tmp_path / "missing")]) == 2
    assert "cannot read the audit log" in capsys.readouterr().err


@pytest.mark.parametrize("tier", ["gvisor", "container"])
def test_oci_tiers_are_audited_the_same_way(tier: str, tmp_path: Path) -> None:
    """The wrapper is tier-agnostic: the same record from the gvisor and container tiers."""
    from trialbox.sandbox.container import ContainerProvider
    from trialbox.sandbox.gvisor import GVisorProvider
    from trialbox.sandbox.oci import OciConfig
    path = str(tmp_path / "oci.jsonl")
    inner = (GVisorProvider if tier == "gvisor" else ContainerProvider)(OciConfig(warm=0))

    async def body() -> None:
        async with inner:
            with AuditLog(AuditConfig(path)) as log:
                provider = audited(inner, log)
                with audit_task(f"{tier}/1"):
                    async with await provider.open(Limits(wall_s=10, output_bytes=2048)) as sb:
                        assert (await sb.exec(["/bin/echo", "hi"])).ok
                        await sb.exec(["python3", "-c", "print('x' * 5000)"])

    asyncio.run(asyncio.wait_for(body(), 60))
    (s,) = read(path)
    assert (s.task_id, s.tier, s.runtime) == (f"{tier}/1", tier, inner.runtime.id)
    assert [c.status for c in s.commands] == ["ok", "output"]
    assert s.commands[0].stdout_bytes == 3 and s.limit_hits == {"output": 1}
