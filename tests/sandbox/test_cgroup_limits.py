"""What the cgroup driver enforces and measures, with limits loose enough for a slow
kernel: these run on this host's cgroup v1 and, by tests/sandbox/test_cgroup_v2.py,
inside user-mode-linux on cgroup v2 (Debian 12's kernel line), where syscalls cost ~70x
and page faults ~20x what they cost here. Statuses and bounds, not speed."""

from __future__ import annotations

import errno
import os

from tests.sandbox.conftest import RunOne, describe, limits, no_leaks
from tests.sandbox.test_hostile import SPLIT_HOG
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.types import ExecStatus

MiB = 1 << 20
SLOW = {"wall_s": 60, "cpu_s": 60}
"""No test below may be ended by the wall clock unless it is about the wall clock."""


def test_the_expected_cgroup_driver_serves(runner):
    """Inside the UML guest TRIALBOX_EXPECT_CGROUP=2: the v2 driver is what ran."""
    want = os.environ.get("TRIALBOX_EXPECT_CGROUP")
    assert runner.pool.cgroups.version == (int(want) if want else runner.pool.cgroups.version)
    assert runner.pool.cgroups.version in (1, 2)


def test_memory_bomb_is_memory(run_one: RunOne, runner):
    r = run_one("b = []\nwhile True:\n    b.append(bytearray(16 << 20))", memory_mb=64,
                **SLOW)
    assert r.status is ExecStatus.MEMORY, describe(r)
    assert 48 * MiB <= r.peak_memory_bytes <= 72 * MiB, r.peak_memory_bytes
    no_leaks(runner)


def test_memory_of_several_processes_is_summed(run_one: RunOne):
    """Four processes of 30 MB each (the hostile battery's split hog): only their total
    is over the limit; the run is `memory` whichever of them the kernel kills."""
    r = run_one(SPLIT_HOG, memory_mb=64, **SLOW)
    assert r.status is ExecStatus.MEMORY, describe(r)


def test_fork_bomb_meets_the_pids_limit(run_one: RunOne):
    code = ("import os, time\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError as e:\n        print(e.errno, flush=True)\n"
            "        os._exit(0)")
    r = run_one(code, pids=16, **SLOW)
    assert r.status in (ExecStatus.OK, ExecStatus.EXIT), describe(r)
    assert r.stdout.split()[0] == str(errno.EAGAIN).encode(), describe(r)


def test_cpu_limit_ends_a_spin(run_one: RunOne):
    r = run_one("while True:\n    pass", cpu_s=2, wall_s=60)
    assert r.status is ExecStatus.TIMEOUT, describe(r)
    # the CPU limit ended it (not the wall clock: that message names wall_s), at that
    # limit by the cgroup's count, well short of the per-process RLIMIT_CPU backstop (9 s)
    assert r.message == "CPU time passed Limits.cpu_s=2", describe(r)
    assert 1900 <= r.cpu_ms < 4000, r.cpu_ms


def test_each_run_of_a_session_has_its_own_peak_and_status(runner):
    """An early run's OOM kill and high peak do not colour a later run's (on kernels
    before 6.12 memory.peak cannot be reset: the driver must not report the old high)."""
    big = "b = bytearray(80 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1"

    async def body():
        async with await NamespaceSandbox.open(runner.pool, limits(memory_mb=128, **SLOW)) \
                as sb:
            r1 = await run_code(sb, big)
            r2 = await run_code(sb, "b = []\nwhile True:\n    b.append(bytearray(16 << 20))")
            r3 = await run_code(sb, "print('small')")
            r4 = await run_code(sb, big)
            return r1, r2, r3, r4
    r1, r2, r3, r4 = runner.run(body(), timeout=600)
    assert r1.status is ExecStatus.OK and r1.peak_memory_bytes >= 80 * MiB, describe(r1)
    assert r2.status is ExecStatus.MEMORY, describe(r2)
    assert (r3.status, r3.stdout) == (ExecStatus.OK, b"small\n"), describe(r3)
    assert r3.peak_memory_bytes < 48 * MiB, r3.peak_memory_bytes
    assert r4.status is ExecStatus.OK and r4.peak_memory_bytes >= 72 * MiB, describe(r4)
    no_leaks(runner)
