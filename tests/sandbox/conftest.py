"""Helpers for the namespace tier's suites: small limits, one-shot runs, sessions.

Every run here is real (the session pool from tests/conftest.py); limits are kept small
so each test finishes in a second or two.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
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


PYTHON_PATH_SMOKE = frozenset({
    # one run of each status, and the measures the supervisor reports
    "test_smoke.py::test_hello", "test_statuses.py::test_ok",
    "test_statuses.py::test_exit_keeps_code", "test_statuses.py::test_failed_exec_is_exit",
    "test_statuses.py::test_signal", "test_statuses.py::test_wall_timeout",
    "test_statuses.py::test_cpu_timeout", "test_statuses.py::test_memory",
    "test_statuses.py::test_output_one_byte_past_cap", "test_statuses.py::test_disk",
    "test_statuses.py::test_cpu_and_wall_measured",
    "test_statuses.py::test_peak_memory_measured",
    "test_statuses.py::test_candidate_never_causes_infra",
    "test_cgroup_limits.py::test_memory_bomb_is_memory",
    "test_cgroup_limits.py::test_fork_bomb_meets_the_pids_limit",
    # the hostile basics: identity, privileges, seccomp, what a run leaves behind
    "test_hostile.py::test_host_files_not_visible",
    "test_hostile.py::test_identity_without_privilege",
    "test_hostile.py::test_privileged_syscalls_fail_with_eperm",
    "test_hostile.py::test_ptrace_denied",
    "test_hostile.py::test_cgroup_and_kernel_interfaces_hidden",
    "test_hostile.py::test_kill_everything_spares_the_host",
    "test_hostile.py::test_double_forked_daemon_dies_with_the_run",
    "test_hostile.py::test_leftovers_do_not_reach_the_next_session",
    "test_hostile.py::test_protocol_lookalike_output_changes_nothing",
    # what C does between a fork and the program (fds, cwd) and B between runs
    "test_session.py::test_files_persist_across_runs",
    "test_session.py::test_park_gives_the_cell_back_and_keeps_the_files",
    "test_session.py::test_pass_fds_gives_the_program_a_channel_while_it_runs",
    "test_session.py::test_close_stops_a_run_in_flight",
    "test_session.py::test_a_last_run_leaves_no_candidate_forked_ahead",
    "test_bad_input.py::test_cwd_that_is_not_a_directory",
    "test_pool.py::test_zygote_death_is_infra_then_recovers",
    "test_native.py::test_pools_use_the_c_path_where_gcc_is",
})
"""The tests `make test` runs on the Python cell path too: enough to show it works (a
run of each status, the hostile basics, the steps C replaces). The rest of the suite
runs there under `make bench` (marked bench_only below). (Other suites that use this
`runner`, tests/adversarial/test_d_containment.py, keep both paths.)"""
HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        spec = getattr(item, "callspec", None)
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if item.path.parent == HERE and spec is not None \
                and spec.params.get("runner") == "python" and name not in PYTHON_PATH_SMOKE:
            item.add_marker(pytest.mark.bench_only)


@pytest.fixture(scope="session", params=["native", "python"])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    """Every test of this suite runs on both implementations of a cell's hot path: C
    (cell.c, what pools use wherever gcc is) and the zygote's Python (the fallback) —
    in `make test` the Python path runs PYTHON_PATH_SMOKE only, `make bench` the rest."""
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
