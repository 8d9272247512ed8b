"""Cgroup limits and accounting for sandbox cells, on cgroup v1 or v2 (detected).

Each cell gets its own cgroup under `trialbox/<pool>/<cell>` in every hierarchy that
holds the memory, pids, cpu and cpuacct controllers (v1: up to four directories; v2:
one). The candidate process joins it itself (it writes "0" to the `cgroup.procs` fds the
supervisor opened for it), so everything it forks is counted and limited. Accounting is
read from here, outside the candidate: CPU time, peak memory, OOM kills.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from trialbox.errors import SandboxUnavailable
from trialbox.types import Limits

CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
CFS_PERIOD_US = 100_000


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount of this process."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _source, superopts = (right.split() + ["", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                mountpoint = left.split()[4].replace("\\040", " ")
                out.append((mountpoint, fstype, set(superopts.split(","))))
    return out


@dataclass(frozen=True)
class CellStats:
    cpu_ns: int
    peak_bytes: int
    oom_kills: int


class CgroupDriver:
    """Creates, limits, measures and removes cell cgroups. `detect()` picks v2 or v1."""

    version: int = 0

    def __init__(self, roots: dict[str, str]):
        self.roots = roots  # controller -> hierarchy mount point (v1) / unified root (v2)

    @staticmethod
    def detect() -> CgroupDriver:
        mounts = _mounts()
        for mountpoint, fstype, _opts in mounts:
            if fstype != "cgroup2":
                continue
            try:
                with open(os.path.join(mountpoint, "cgroup.controllers")) as f:
                    available = set(f.read().split())
            except OSError:
                continue
            if {"memory", "pids", "cpu"} <= available:
                return CgroupV2(mountpoint)
        roots: dict[str, str] = {}
        for mountpoint, fstype, opts in mounts:
            if fstype == "cgroup":
                for c in CONTROLLERS:
                    if c in opts and c not in roots:
                        roots[c] = mountpoint
        missing = [c for c in CONTROLLERS if c not in roots]
        if missing:
            raise SandboxUnavailable(
                "the namespace tier needs cgroup controllers "
                f"{', '.join(missing)} (v1) or memory+pids+cpu on a cgroup2 mount; none "
                "found in /proc/self/mountinfo — mount them or use another tier")
        return CgroupV1(roots)

    # -- per cell ---------------------------------------------------------------
    def dirs(self, rel: str) -> list[str]:
        raise NotImplementedError

    def create(self, rel: str, limits: Limits) -> list[str]:
        """Make the cell's cgroup(s), apply limits; return the `cgroup.procs` paths."""
        raise NotImplementedError

    def set_limits(self, rel: str, limits: Limits) -> None:
        raise NotImplementedError

    def stats(self, rel: str) -> CellStats:
        raise NotImplementedError

    def procs_files(self, rel: str) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs(rel)]

    def pids(self, rel: str) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files(rel):
            try:
                with open(path) as f:
                    found.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return sorted(found)

    def kill_all(self, rel: str) -> None:
        for pid in self.pids(rel):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, rel: str) -> bool:
        """rmdir the cell's cgroup(s), children first. False if something was still busy."""
        ok = True
        for d in self.dirs(rel):
            try:
                os.rmdir(d)  # the common case: a leaf cell cgroup, no stat storm
            except FileNotFoundError:
                pass
            except OSError:
                ok = _rmtree_cgroup(d) and ok
        return ok

    def parent_dirs(self, rel: str) -> list[str]:
        return self.dirs(rel)


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _rmtree_cgroup(d: str) -> bool:
    ok = True
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return True
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            ok = _rmtree_cgroup(entry.path) and ok
    try:
        os.rmdir(d)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return ok


class CgroupV1(CgroupDriver):
    version = 1

    def dirs(self, rel: str) -> list[str]:
        seen: list[str] = []
        for c in CONTROLLERS:
            d = os.path.join(self.roots[c], rel)
            if d not in seen:
                seen.append(d)
        return seen

    def _d(self, controller: str, rel: str) -> str:
        return os.path.join(self.roots[controller], rel)

    def create(self, rel: str, limits: Limits) -> list[str]:
        for d in self.dirs(rel):
            try:
                os.mkdir(d)
            except FileNotFoundError:
                os.makedirs(d, exist_ok=True)
            except FileExistsError:
                pass
        self.set_limits(rel, limits)
        return self.procs_files(rel)

    def set_limits(self, rel: str, limits: Limits) -> None:
        _write(os.path.join(self._d("memory", rel), "memory.limit_in_bytes"),
               str(limits.memory_bytes))
        _write(os.path.join(self._d("pids", rel), "pids.max"), str(limits.pids))
        cpu = self._d("cpu", rel)
        _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
        _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(int(limits.cpus * CFS_PERIOD_US)))

    def stats(self, rel: str) -> CellStats:
        cpu_ns = int(_read(os.path.join(self._d("cpuacct", rel), "cpuacct.usage")))
        mem = self._d("memory", rel)
        peak = int(_read(os.path.join(mem, "memory.max_usage_in_bytes")))
        oom = 0
        for line in _read(os.path.join(mem, "memory.oom_control")).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                oom = int(value)
        return CellStats(cpu_ns, peak, oom)


class CgroupV2(CgroupDriver):
    version = 2

    def __init__(self, root: str):
        super().__init__({c: root for c in CONTROLLERS})
        self.root = root

    def dirs(self, rel: str) -> list[str]:
        return [os.path.join(self.root, rel)]

    def create(self, rel: str, limits: Limits) -> list[str]:
        # Every ancestor below the root must delegate the controllers to its children.
        parts = rel.strip("/").split("/")
        path = self.root
        for part in parts:
            ctl = os.path.join(path, "cgroup.subtree_control")
            try:
                if not {"memory", "pids", "cpu"} <= set(_read(ctl).split()):
                    _write(ctl, "+memory +pids +cpu")
            except OSError as e:
                raise SandboxUnavailable(f"cannot delegate cgroup controllers at {path}: "
                                         f"{e}") from e
            path = os.path.join(path, part)
            os.makedirs(path, exist_ok=True)
        self.set_limits(rel, limits)
        return self.procs_files(rel)

    def set_limits(self, rel: str, limits: Limits) -> None:
        d = os.path.join(self.root, rel)
        _write(os.path.join(d, "memory.max"), str(limits.memory_bytes))
        _write(os.path.join(d, "memory.swap.max"), "0") if os.path.exists(
            os.path.join(d, "memory.swap.max")) else None
        _write(os.path.join(d, "pids.max"), str(limits.pids))
        _write(os.path.join(d, "cpu.max"), f"{int(limits.cpus * CFS_PERIOD_US)} {CFS_PERIOD_US}")

    def stats(self, rel: str) -> CellStats:
        d = os.path.join(self.root, rel)
        cpu_ns = 0
        for line in _read(os.path.join(d, "cpu.stat")).splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                cpu_ns = int(value) * 1000
        try:
            peak = int(_read(os.path.join(d, "memory.peak")))
        except OSError:  # kernels before 5.19 have no memory.peak
            peak = int(_read(os.path.join(d, "memory.current")))
        oom = 0
        for line in _read(os.path.join(d, "memory.events")).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                oom = int(value)
        return CellStats(cpu_ns, peak, oom)

    def kill_all(self, rel: str) -> None:
        kill = os.path.join(self.root, rel, "cgroup.kill")
        if os.path.exists(kill):
            _write(kill, "1")
        else:
            super().kill_all(rel)
