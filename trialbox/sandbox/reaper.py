"""Host clean-up: what dead pools left behind, found by the names they gave it.

Everything a pool (or the OCI tier's provider) creates on the host lives under names that
carry its owner's pid and start time (`/run/trialbox/<pid>-<start>-<n>/…`,
`<cgroup>/trialbox/<pid>-<start>-<n>/…`: `owner_id`). Pids are reused, start times are
not, so a new pool can tell which owners are dead and reap what they left: processes in
their cgroups, the cgroups, mounts and state directories (`reap_orphans`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import time

from trialbox.sandbox import mounts
from trialbox.sandbox.cgroups import CgroupDriver


def _proc_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


_pool_seq = itertools.count(1)


def owner_id(pid: int | None = None) -> str:
    """`<pid>-<process start time>-<n>`: unique per pool, and tells whether its owner
    process is still alive (pids are reused; start times are not)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_proc_start(pid)}-{next(_pool_seq)}"


def owner_alive(name: str) -> bool:
    """Whether the process named by an `owner_id` still runs (True for names that are
    not ours: they are left alone)."""
    parts = name.split("-")
    if len(parts) < 2 or not parts[0].isdigit():
        return True  # not ours: leave it alone
    return _proc_start(int(parts[0])) == parts[1]


def reap_orphans(state_dir: str, driver: CgroupDriver) -> dict[str, int]:
    """Remove what dead pools left: processes in their cgroups, the cgroups, mounts."""
    counts = {"processes": 0, "cgroups": 0, "mounts": 0}
    if os.path.isdir(state_dir):
        for name in os.listdir(state_dir):
            if owner_alive(name):
                continue
            path = os.path.join(state_dir, name)
            for mp in mounts.mounts_under(path):
                mounts.umount(mp)
                counts["mounts"] += 1
            shutil.rmtree(path, ignore_errors=True)
    for top in driver.dirs("trialbox"):
        if not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            if not os.path.isdir(os.path.join(top, name)) or owner_alive(name):
                continue
            rel = f"trialbox/{name}"
            for _ in range(50):
                pids = [p for d in _cell_dirs(top, name) for p in _cg_pids(d)]
                if not pids:
                    break
                counts["processes"] += len(pids)
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
                time.sleep(0.02)
            if driver.remove(rel):
                counts["cgroups"] += 1
    return counts


def _cell_dirs(top: str, name: str) -> list[str]:
    base = os.path.join(top, name)
    return [base] + [os.path.join(base, c) for c in os.listdir(base)
                     if os.path.isdir(os.path.join(base, c))]


def _cg_pids(d: str) -> list[int]:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
