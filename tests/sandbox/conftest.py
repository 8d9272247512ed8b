"""Helpers for the namespace tier's suites: small limits, one-shot runs, sessions.

Every run here is real (the session pool from tests/conftest.py); limits are kept small
so each test finishes in a second or two.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trialbox.sandbox import NamespaceSandbox, PoolConfig, run_code
from trialbox.types import ExecResult, ExecStatus, Limits
from tests.conftest import TIME_SCALE, Runner, eventually

KiB = 1024
FAST = Limits(wall_s=3 * TIME_SCALE, cpu_s=3 * TIME_SCALE, memory_mb=128, disk_mb=32,
              output_bytes=64 * KiB)
"""Default limits for these suites: enough for an interpreter, small enough to hit."""

CANDIDATE_STATUSES = frozenset(ExecStatus) - {ExecStatus.INFRA}


def limits(**changes: Any) -> Limits:
    return FAST.with_(**changes)


RunOne = Callable[..., ExecResult]


@pytest.fixture(scope="session", params=["native", "python"])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    """Every test of this suite runs on both implementations of a cell's hot path: C
    (cell.c, what pools use wherever gcc is) and the zygote's Python (the fallback)."""
    r = Runner(PoolConfig(warm=2, native="on" if request.param == "native" else "off"))
    assert r.pool.native is (request.param == "native")
    yield r
    r.close()


@pytest.fixture
def run_one(runner: Any) -> RunOne:
    """`run_one(code, lang="python", stdin=b"", **limit_changes)`: a fresh session, one
    run of `code`, session closed; returns the ExecResult."""

    def go(code: str | bytes, lang: str = "python", stdin: bytes = b"",
           **changes: Any) -> ExecResult:
        async def body() -> ExecResult:
            async with await NamespaceSandbox.open(runner.pool, limits(**changes)) as sb:
                return await run_code(sb, code, lang, stdin=stdin)
        result: ExecResult = runner.run(body())
        return result

    return go


def describe(r: ExecResult) -> str:
    """A short account of a result for assertion messages."""
    return (f"status={r.status.value} exit={r.exit_code} signal={r.signal} "
            f"msg={r.message!r} stdout={r.stdout[:300]!r} stderr={r.stderr[-600:]!r}")


def no_leaks(runner: Any) -> None:
    """`runner.assert_no_leaks()`, after letting the pool finish warming spare cells.

    A spare cell's cgroup exists a moment before the pool lists the cell as live, and
    `assert_no_leaks` polls with the event loop stopped, so a warm-up caught in between
    would read as a stray cgroup. Settling first keeps the check exact: any process,
    cgroup or mount still there afterwards is a real leak.
    """
    runner.run(eventually(lambda: not runner.pool._warming, 5))
    runner.assert_no_leaks()


def processes_in_cgroup(fragment: str) -> list[int]:
    """Pids of every process whose cgroup path contains `fragment` (e.g. a pool's id:
    its sandboxes cannot leave their cells' cgroups)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                if fragment in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found
