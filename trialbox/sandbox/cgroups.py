"""Cgroup limits and accounting for sandbox cells, on cgroup v1 or v2 (detected).

Each cell gets its own cgroup under `trialbox/<pool>/<cell>` in every hierarchy that
holds the memory, pids, cpu and cpuacct controllers (v1: up to four directories; v2:
one). The candidate process joins it itself (it writes "0" to the `cgroup.procs` fds the
supervisor opened for it), so everything it forks is counted and limited. Accounting is
read from here, outside the candidate: CPU time, peak memory, OOM kills.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass

from trialbox.errors import CandidateFault, SandboxUnavailable
from trialbox.types import Limits

CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
CFS_PERIOD_US = 100_000
SOCKET_SHARE = 4
"""cgroup v1 only: socket buffers (TCP, UDP) are charged to a counter of their own,
limited to `memory_mb / SOCKET_SHARE` (at least SOCKET_MIN); v2 charges them to the
memory limit itself."""
SOCKET_MIN = 4 << 20


def socket_bytes(limits: Limits) -> int:
    """The v1 socket-buffer limit for a run with `limits` (see SOCKET_SHARE)."""
    return max(SOCKET_MIN, limits.memory_bytes // SOCKET_SHARE)


class OverBudget(CandidateFault):
    """The session already holds more memory than a run may start with (what earlier
    runs left charged to the cell: SysV shared memory, files beyond the workspace's
    size...): the candidate's doing, reported as the run's `memory` status."""

    def __init__(self, held: int, limit: int):
        super().__init__(f"the session holds {held} bytes, above a run's limit of {limit}")
        self.held, self.limit = held, limit


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
    usage_bytes: int = 0


def _pread_int(fd: int, key: str | None = None) -> int:
    """An integer from a cgroup file: the whole file, or the value of `key` in it."""
    text = os.pread(fd, 4096, 0).decode()
    if key is None:
        return int(text.split()[0]) if text.strip() not in ("", "max") else 0
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return 0


class CellFiles:
    """The accounting and limit files of one cell's cgroup, kept open for the cell's life.

    A cell serves every run of one session, so each run starts by `begin_run` (limits
    written, peak reset, counters snapshotted) and ends by `end_run` (the deltas). What
    the session's earlier runs left is charged to the cell too (its files' pages and
    inodes, SysV shared memory): a run's memory limit is `Limits.memory_bytes` on top of
    what the session holds, but never more than `carry` on top — the most its files
    can take — so nothing else left behind raises the next run's limit (the "ratchet":
    k runs each leaving `memory_mb` of shared memory would hold k x `memory_mb`). It
    counts against the run instead, and a session holding more than a run may start
    with gets `OverBudget`.
    """

    def __init__(self, paths: dict[str, str], version: int):
        self.version = version
        self.fds: dict[str, int] = {}
        try:
            for name, path in paths.items():
                flags = os.O_WRONLY if name == "reclaim" else os.O_RDWR if name in (
                    "peak", "mem_limit", "pids_limit", "cpu_limit", "tcp_limit",
                    "tcp_peak") else os.O_RDONLY
                try:
                    self.fds[name] = os.open(path, flags | os.O_CLOEXEC)
                except FileNotFoundError:
                    # v2 before 5.19 has no memory.peak nor memory.reclaim; a v1
                    # kernel without socket accounting, no kmem.tcp files
                    if name not in ("peak", "tcp_limit", "tcp_peak", "reclaim"):
                        raise
        except BaseException:
            self.close()
            raise
        self.base = CellStats(0, 0, 0)
        self.carried = 0  # what the run started with and was not charged for (begin_run)
        # Can a run's peak be reset? v1 always; v2 from 6.12 (a per-fd reset of
        # memory.peak). Before that (Debian 12's 6.1) memory.peak is the cell's lifetime
        # high: a run's own peak is exact only when it sets a new high, and is otherwise
        # the highest usage sampled while it ran (snapshot(): every CPU poll, 50 ms).
        self.peak_resets = version == 1
        self.sampled = 0
        self.written: dict[str, str] = {}  # limit file -> the value last written to it

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def _write(self, name: str, value: str) -> None:
        os.pwrite(self.fds[name], value.encode(), 0)

    def _limit(self, name: str, value: str) -> None:
        """Write a limit unless it holds that value already (a cell keeps its cgroup from
        session to session, and most runs ask for the limits the last one had); nobody
        else writes these files."""
        if self.written.get(name) != value:
            self.written.pop(name, None)  # unknown if the write fails
            self._write(name, value)
            self.written[name] = value

    def snapshot(self) -> CellStats:
        if self.version == 1:
            cpu = _pread_int(self.fds["cpu"])
            oom = _pread_int(self.fds["oom"], "oom_kill")
        else:
            cpu = _pread_int(self.fds["cpu"], "usage_usec") * 1000
            oom = _pread_int(self.fds["oom"], "oom_kill")
        usage = _pread_int(self.fds["usage"])
        peak = _pread_int(self.fds["peak"]) if "peak" in self.fds else usage
        self.sampled = max(self.sampled, usage)
        return CellStats(cpu, peak, oom, usage)

    def begin_run(self, limits: Limits, carry: int) -> None:
        """Limits and baselines for the next run; `carry`: the most the session may hold
        from its earlier runs without it counting against this one (its workspace's
        size and inodes). Raises OverBudget when the session holds too much to start."""
        usage = _pread_int(self.fds["usage"])
        self.carried = min(usage, carry)
        mem = limits.memory_bytes + self.carried
        if self.version == 1:
            try:  # below the usage, the kernel reclaims what it can first (page cache)
                self._limit("mem_limit", str(mem))
            except OSError as e:
                if e.errno == errno.EBUSY:  # it could not: the session holds too much
                    raise OverBudget(usage, mem) from None
                raise
            self._limit("pids_limit", str(limits.pids))
            self._limit("cpu_limit", str(int(limits.cpus * CFS_PERIOD_US)))
            self._write("peak", "0")  # v1: resets max_usage to the current usage
            if "tcp_limit" in self.fds:  # socket buffers: a counter of their own on v1
                self._limit("tcp_limit", str(socket_bytes(limits)))  # (peak: end_run)
        else:
            if usage > mem:  # v2 would OOM-kill the waiting candidate: reclaim first
                if "reclaim" in self.fds:
                    try:
                        self._write("reclaim", str(usage - mem))
                    except OSError:
                        pass
                usage = _pread_int(self.fds["usage"])
                if usage > mem:
                    raise OverBudget(usage, mem)
            self._limit("mem_limit", str(mem))
            self._limit("pids_limit", str(limits.pids))
            self._limit("cpu_limit", f"{int(limits.cpus * CFS_PERIOD_US)} {CFS_PERIOD_US}")
            if "peak" in self.fds:
                try:
                    self._write("peak", "reset")  # 6.12+: a per-fd peak reset
                    self.peak_resets = True
                except OSError:
                    self.peak_resets = False
        self.sampled = 0
        self.base = self.snapshot()

    def end_run(self) -> CellStats:
        """The run's deltas. Its peak is what counted against `Limits.memory_mb`: the
        cell's peak less what the run started with within `carry`, plus (v1) the peak
        of its socket buffers, which that kernel counts apart."""
        now = self.snapshot()
        sockets = 0
        if "tcp_peak" in self.fds:  # read, then reset for the next run (off its start)
            sockets = _pread_int(self.fds["tcp_peak"])
            self._write("tcp_peak", "0")
        peak = now.peak_bytes
        if not self.peak_resets:  # exact only if this run set the cell's lifetime high
            peak = max(self.sampled, peak if peak > self.base.peak_bytes else 0)
        return CellStats(cpu_ns=now.cpu_ns - self.base.cpu_ns,
                         peak_bytes=max(0, peak - self.carried) + sockets,
                         oom_kills=now.oom_kills - self.base.oom_kills,
                         usage_bytes=now.usage_bytes)


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

    def open_files(self, rel: str) -> CellFiles:
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
        mem = self._d("memory", rel)
        _write(os.path.join(mem, "memory.limit_in_bytes"), str(limits.memory_bytes))
        # Socket buffers are charged (and limited) only in a cgroup whose TCP limit was
        # written before its sockets were made: here, before any process joins.
        tcp = os.path.join(mem, "memory.kmem.tcp.limit_in_bytes")
        if os.path.exists(tcp):
            _write(tcp, str(socket_bytes(limits)))
        _write(os.path.join(self._d("pids", rel), "pids.max"), str(limits.pids))
        cpu = self._d("cpu", rel)
        _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
        _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(int(limits.cpus * CFS_PERIOD_US)))

    def open_files(self, rel: str) -> CellFiles:
        mem = self._d("memory", rel)
        return CellFiles({
            "cpu": os.path.join(self._d("cpuacct", rel), "cpuacct.usage"),
            "usage": os.path.join(mem, "memory.usage_in_bytes"),
            "peak": os.path.join(mem, "memory.max_usage_in_bytes"),
            "oom": os.path.join(mem, "memory.oom_control"),
            "mem_limit": os.path.join(mem, "memory.limit_in_bytes"),
            "tcp_limit": os.path.join(mem, "memory.kmem.tcp.limit_in_bytes"),
            "tcp_peak": os.path.join(mem, "memory.kmem.tcp.max_usage_in_bytes"),
            "pids_limit": os.path.join(self._d("pids", rel), "pids.max"),
            "cpu_limit": os.path.join(self._d("cpu", rel), "cpu.cfs_quota_us"),
        }, 1)


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

    def open_files(self, rel: str) -> CellFiles:
        d = os.path.join(self.root, rel)
        return CellFiles({
            "cpu": os.path.join(d, "cpu.stat"), "usage": os.path.join(d, "memory.current"),
            "peak": os.path.join(d, "memory.peak"), "oom": os.path.join(d, "memory.events"),
            "mem_limit": os.path.join(d, "memory.max"),
            "reclaim": os.path.join(d, "memory.reclaim"),
            "pids_limit": os.path.join(d, "pids.max"), "cpu_limit": os.path.join(d, "cpu.max"),
        }, 2)

    def kill_all(self, rel: str) -> None:
        kill = os.path.join(self.root, rel, "cgroup.kill")
        if os.path.exists(kill):
            _write(kill, "1")
        else:
            super().kill_all(rel)
