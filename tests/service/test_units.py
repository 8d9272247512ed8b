"""The service's pieces on their own: admission queue, token bucket and its table,
session expiry and the per-client cap, config checks, the Host/Origin rule, names that
are not UTF-8, and the SandboxFusion status mapping for every ExecStatus."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from trialbox.errors import UsageError
from trialbox.sandbox.fake import FakeProvider, FakeSandbox
from trialbox.service.admission import Admission, Overloaded
from trialbox.service.config import ServiceConfig, host_name, is_loopback
from trialbox.service.fusion import fusion_response
from trialbox.service.guard import RateLimiter, TokenBucket, client_key, refused_origin
from trialbox.service.names import escaped, shown, workspace_names
from trialbox.service.state import Sessions
from trialbox.store.journal import Journal
from trialbox.types import ExecResult, ExecStatus, Limits


async def _admission(running: int, queued: int, wait_s: float) -> Admission:
    return await Admission(running=running, queued=queued, wait_s=wait_s).start(
        FakeProvider())


def test_admission_bounds_running_and_waiting() -> None:
    async def body() -> None:
        adm = await _admission(running=1, queued=1, wait_s=5)
        release = asyncio.Event()

        async def hold() -> None:
            async with adm.slot():
                await release.wait()

        first = asyncio.create_task(hold())
        await asyncio.sleep(0.05)
        second = asyncio.create_task(hold())
        await asyncio.sleep(0.05)
        assert (adm.running, adm.waiting) == (1, 1)
        with pytest.raises(Overloaded) as e:  # full: refused at once
            async with adm.slot():
                pass
        assert e.value.retry_after >= 1
        release.set()
        await asyncio.gather(first, second)
        assert (adm.running, adm.waiting, adm.admitted) == (0, 0, 2)
        await adm.close()

    asyncio.run(body())


def test_admission_wait_times_out() -> None:
    async def body() -> None:
        adm = await _admission(running=1, queued=4, wait_s=10)
        async with adm.slot():
            # the request's 0.1 s ran out (not the admission's wait_s=10): its message
            # names the time waited, which load cannot change
            with pytest.raises(Overloaded, match="no sandbox slot became free within 0.1 s"):
                async with adm.slot(timeout=0.1):
                    pass
        assert adm.waiting == 0
        await adm.close()

    asyncio.run(body())


def test_every_admitted_request_is_a_journaled_scheduler_task(tmp_path: Path) -> None:
    """Admission is the scheduler: each slot is a task at the interactive tier, its
    lease EXECUTING only while code runs, its outcome the task's one result row; a
    waiter refused for time is CANCELLED, nothing run."""
    async def body() -> None:
        provider = FakeProvider()
        adm = await Admission(running=1, queued=4, wait_s=10,
                              journal=str(tmp_path / "j.db")).start(provider)
        assert adm.scheduler is not None and adm.scheduler.config.max_active == 1
        async with adm.slot(kind="exec") as ticket:
            async with ticket.ctx.lease(Limits(wall_s=1)) as sb:
                await sb.exec(["true"])
            ticket.reward = 0.0
            with pytest.raises(Overloaded):  # the one slot is held: times out waiting
                async with adm.slot(timeout=0.05, kind="exec"):
                    pass
        with pytest.raises(ValueError, match="boom"):
            async with adm.slot(kind="exec"):
                raise ValueError("boom")
        assert adm.scheduler is not None
        await adm.scheduler.drain()
        run = adm.run_id
        await adm.close()
        assert all(sb.closed for sb in provider.opened) and len(provider.opened) == 1
        with Journal(str(tmp_path / "j.db")) as j:
            results = j.results_of(run)
            moves = [(t, o, n) for (t, o, n) in j.conn.execute(
                "SELECT task_id, old, new FROM transitions WHERE run_id=? ORDER BY seq",
                (run,))]
            prio = {t: p for (t, p) in j.conn.execute(
                "SELECT task_id, priority FROM tasks WHERE run_id=?", (run,))}
        assert results["exec-1"][0] == "done" and results["exec-1"][2] == 0.0
        assert results["exec-2"][0] == "cancelled"
        assert results["exec-3"][0] == "failed" and results["exec-3"][2] is None
        assert set(prio.values()) == {0}  # the interactive tier
        first = [(o, n) for (t, o, n) in moves if t == "exec-1"]
        assert first == [("", "pending"), ("pending", "queued"), ("queued", "generating"),
                         ("generating", "executing"), ("executing", "generating"),
                         ("generating", "grading"), ("grading", "done")]
        assert not any(n == "executing" for (t, o, n) in moves if t == "exec-2")

    asyncio.run(body())


def test_token_bucket() -> None:
    b = TokenBucket(rate=10, burst=2)
    assert b.take() == 0 and b.take() == 0
    wait = b.take()
    assert 0 < wait <= 0.1 + 1e-6
    time.sleep(0.11)
    assert b.take() == 0


def test_rate_limiter_table_is_bounded_without_resetting_anyone() -> None:
    """10,001 newcomers neither clear a drained bucket nor get fresh ones: only
    buckets back at their burst (no different from new ones) are dropped, and when
    none is, newcomers share one overflow bucket."""
    lim = RateLimiter(rate=0.001, burst=2, max_buckets=100)
    assert lim.take("victim") == 0 and lim.take("victim") == 0 and lim.take("victim") > 0
    waits = [lim.take(f"new-{i}") for i in range(10_001)]
    assert len(lim.buckets) == 100 and "victim" in lim.buckets
    assert lim.take("victim") > 0  # still drained
    assert waits.count(0.0) < 100 + 2  # one bucket each while room lasts, then shared
    fast = RateLimiter(rate=1e9, burst=1, max_buckets=2)
    fast.take("a")
    fast.take("b")
    assert fast.take("c") == 0 and set(fast.buckets) == {"c"}  # refilled ones dropped


def test_client_key_is_the_address_never_a_header() -> None:
    assert client_key({"client": ("10.1.2.3", 5)}) == "10.1.2.3"
    assert client_key({"client": ("::ffff:10.1.2.3", 5)}) == "10.1.2.3"
    assert client_key({"client": ("2001:db8::1", 5)}) == client_key(
        {"client": ("2001:db8::ffff:2", 5)}) == "2001:db8::/64"
    assert client_key({}) == "?"


@pytest.mark.parametrize(("host", "origin", "method", "refused"), [
    ("127.0.0.1:8080", None, "POST", ""),
    ("localhost:8080", "http://localhost:8080", "POST", ""),
    ("[::1]:8080", "http://[::1]:8080", "DELETE", ""),
    ("LOCALHOST.:8080", None, "GET", ""),
    ("proxy.example", "https://proxy.example", "POST", ""),  # --allowed-host
    ("attacker.example:8080", None, "GET", "host"),
    ("127.0.0.1:8080", "http://attacker.example", "POST", "origin"),
    ("127.0.0.1:8080", "null", "PUT", "origin"),
    ("127.0.0.1:8080", "http://127.0.0.1:9999", "POST", "origin"),  # another local site
    ("127.0.0.1:8080", "http://attacker.example", "GET", ""),  # reads: the browser's rule
])
def test_host_and_origin_rule(host: str, origin: str | None, method: str,
                              refused: str) -> None:
    config = ServiceConfig(allowed_hosts=("proxy.example",))
    headers = {"host": host, **({"origin": origin} if origin else {})}
    kind, why = refused_origin(config, headers, method)
    assert kind == refused, why
    assert host_name("[::1]:80") == "::1" and host_name("Example.COM.") == "example.com"


def test_names_that_are_not_utf8() -> None:
    name = b"d/bad-\xff\xfe.txt".decode("utf-8", "surrogateescape")
    assert shown(name) == "d/bad-\\xff\\xfe.txt" and shown("plain é.txt") == "plain é.txt"
    assert escaped(name) == {"name": shown(name), "name_b64": "ZC9iYWQt//4udHh0"}
    assert escaped("plain.txt") is None
    assert workspace_names(shown(name)) == [shown(name), name]
    assert workspace_names("a\\x41.txt") == ["a\\x41.txt"]  # ASCII is never escaped


def test_sessions_are_capped_per_client() -> None:
    sessions = Sessions(limit=4, idle_s=60, per_client=2)
    sessions.add(FakeSandbox(), Limits(), owner="a")
    with sessions.opening("a"):
        assert sessions.held("a") == 2 and sessions.held("b") == 0
    assert sessions.held("a") == 1 and not sessions.full()
    assert ServiceConfig().sessions_per_client == 128
    assert ServiceConfig(max_sessions=1).sessions_per_client == 1
    with pytest.raises(UsageError, match="max_sessions_per_client"):
        ServiceConfig(max_sessions=4, max_sessions_per_client=5)


def test_idle_sessions_expire_busy_ones_do_not() -> None:
    async def body() -> None:
        sessions = Sessions(limit=2, idle_s=0.05)
        a = sessions.add(FakeSandbox(), Limits())
        b = sessions.add(FakeSandbox(), Limits())
        assert sessions.full()
        await b.lock.acquire()  # b is running something
        await asyncio.sleep(0.06)
        assert [s.id for s in sessions.idle()] == [a.id]
        with pytest.raises(UsageError, match="no open session"):
            sessions.get(a.id)
        b.lock.release()
        assert sessions.get(b.id) is b

    asyncio.run(body())


def test_config_checks() -> None:
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    with pytest.raises(UsageError, match="without a token"):
        ServiceConfig(host="10.0.0.1")
    ServiceConfig(host="10.0.0.1", token="x" * 16)
    for bad in ({"port": 70000}, {"max_running": 0}, {"deadline_s": -1}, {"token": " "},
                {"rate_per_s": float("nan")}, {"read_timeout_s": 0},
                {"allowed_hosts": ("a.example, b.example",)}):
        with pytest.raises(UsageError):
            ServiceConfig(**bad)  # type: ignore[arg-type]


def _r(status: ExecStatus, **kw: object) -> ExecResult:
    return ExecResult(status, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("result", "top", "run", "code"), [
    (_r(ExecStatus.OK, exit_code=0), "Success", "Finished", 0),
    (_r(ExecStatus.EXIT, exit_code=3), "Failed", "Finished", 3),
    (_r(ExecStatus.SIGNAL, signal=11), "Failed", "Finished", -11),
    (_r(ExecStatus.TIMEOUT, signal=9), "Failed", "TimeLimitExceeded", None),
    # a limit's stop: as SandboxFusion's kills read (a return code), the reason on stderr
    (_r(ExecStatus.MEMORY, signal=9, message="memory passed Limits.memory_mb=64"),
     "Failed", "Finished", -9),
    (_r(ExecStatus.MEMORY, message="memory passed Limits.memory_mb=64"),
     "Failed", "Finished", -9),
    (_r(ExecStatus.OUTPUT, signal=9, stderr=b"partial", message="stdout past 1 MiB"),
     "Failed", "Finished", -9),
    (_r(ExecStatus.DISK, exit_code=1, message="workspace full"), "Failed", "Finished", 1),
    (_r(ExecStatus.INFRA, message="zygote died"), "SandboxError", "Error", None),
])
def test_fusion_status_mapping(result: ExecResult, top: str, run: str,
                               code: int | None) -> None:
    res = fusion_response(result, {})
    assert res["status"] == top and res["run_result"]["status"] == run
    assert res["run_result"]["return_code"] == code
    assert res["run_result"]["trialbox_status"] == result.status.value
    assert res["compile_result"] is None
    stderr = res["run_result"]["stderr"]
    if result.status in (ExecStatus.MEMORY, ExecStatus.OUTPUT, ExecStatus.DISK):
        assert stderr == (result.stderr_text + ("\n" if result.stderr else "")
                          + f"trialbox: {result.status.value} limit: {result.message}\n")
    else:
        assert stderr == result.stderr_text


def test_fusion_compile_failure_has_no_run_result() -> None:
    compiled = _r(ExecStatus.EXIT, exit_code=1, stderr=b"error: expected ';'")
    from dataclasses import replace
    res = fusion_response(replace(compiled, compile=compiled), {"x": None, "y": "eQ=="})
    assert res["status"] == "Failed" and res["run_result"] is None
    assert res["compile_result"]["return_code"] == 1
    assert "expected" in res["compile_result"]["stderr"]
    assert res["files"] == {"y": "eQ=="}
