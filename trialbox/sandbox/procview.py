"""What a sandbox reads in /proc/meminfo, /proc/stat, /proc/loadavg and /proc/cpuinfo:
its own limits, not the host's machine (docs/adversary.md, L).

The kernel answers those files for the whole machine whatever namespace reads them, so
a namespace-tier or container sandbox read the host's memory total and use, its load
and its CPU counters. Each sandbox now has a directory of its own of these four files,
bound read-only over the /proc entries (zygote.build_root on the namespace tier, the
bundle's mounts on the container tier; under gVisor, whose kernel has a /proc of its
own, only meminfo, whose MemTotal was the host's), and rewritten in place when a run's
limits change what they say (`ProcView.show`: a tuple compare when they do not, as
almost always):

    meminfo   MemTotal, MemFree, MemAvailable, CommitLimit: the run's memory limit;
              every other amount 0 (the host's field names and order; VmallocTotal and
              Hugepagesize, constants of the kernel, as the host has them)
    stat      one cpuN line per CPU of the run's allowance (ceil(Limits.cpus), at most
              the host's online CPUs), counters 0; btime the host's (process start
              times in /proc/<pid>/stat count from it, and `ps` adds the two)
    loadavg   "0.00 0.00 0.00 0/0 0", as gVisor shows
    cpuinfo   the host's first N processor entries (N as in stat): the model is the
              machine's, the count the allowance's

glibc counts online CPUs from /proc/stat where /sys is not mounted (the namespace and
container tiers), so `os.cpu_count()`, `multiprocessing.cpu_count()` and
`sysconf(_SC_NPROCESSORS_ONLN)` say the allowance. `nproc` and
`os.sched_getaffinity` still count the CPUs the sandbox may be scheduled on (all of
them: the allowance is a CFS quota, not a cpuset).

The files are static: MemFree does not fall as the sandbox allocates (lxcfs reads the
cgroup at each read through FUSE; that costs a daemon and a context switch per read).
"""

from __future__ import annotations

import math
import os
import re
from functools import cache, lru_cache

from trialbox.types import Limits

NAMES = ("meminfo", "stat", "loadavg", "cpuinfo")
"""The /proc entries each sandbox sees a file of its own for."""
LOADAVG = b"0.00 0.00 0.00 0/0 0\n"
_KEPT = {"VmallocTotal", "Hugepagesize"}
_LIMIT = {"MemTotal", "MemFree", "MemAvailable", "CommitLimit"}
_FIELD = re.compile(r"^([^:]+):\s*(\d+)( kB)?$")


@cache
def _host() -> tuple[list[tuple[str, int, bool]], int, list[str], int]:
    """The host's meminfo fields (name, value, in kB), its boot time, its cpuinfo
    processor entries and its online CPUs: read once per process."""
    fields = []
    with open("/proc/meminfo") as f:
        for line in f:
            m = _FIELD.match(line.rstrip("\n"))
            if m:
                fields.append((m[1], int(m[2]), bool(m[3])))
    btime = 0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                btime = int(line.split()[1])
    with open("/proc/cpuinfo") as f:
        entries = [e.strip("\n") + "\n" for e in f.read().split("\n\n") if e.strip()]
    return fields, btime, entries, os.cpu_count() or 1


def cpus_shown(limits: Limits) -> int:
    """How many CPUs a sandbox with `limits` is shown: its CFS allowance rounded up, at
    least 1, at most the host's online CPUs."""
    return max(1, min(_host()[3], math.ceil(limits.cpus)))


def meminfo(memory_bytes: int) -> bytes:
    fields = _host()[0]
    kb = memory_bytes >> 10
    lines = []
    for name, value, in_kb in fields:
        shown = kb if name in _LIMIT else value if name in _KEPT else 0
        lines.append(f"{name + ':':<16}{shown:>8}" + (" kB" if in_kb else ""))
    return ("\n".join(lines) + "\n").encode()


def stat(cpus: int) -> bytes:
    btime = _host()[1]
    zeros = " 0" * 10
    lines = [f"cpu {zeros}"] + [f"cpu{i}{zeros}" for i in range(cpus)]
    lines += ["intr 0", "ctxt 0", f"btime {btime}", "processes 0", "procs_running 1",
              "procs_blocked 0", "softirq" + " 0" * 11]
    return ("\n".join(lines) + "\n").encode()


def cpuinfo(cpus: int) -> bytes:
    entries = _host()[2]
    return "\n".join(entries[:cpus]).encode()


@lru_cache(maxsize=64)
def contents(memory_bytes: int, cpus: int,
             names: tuple[str, ...] = NAMES) -> tuple[tuple[str, bytes], ...]:
    """The files (of NAMES) a sandbox reads with a memory limit of `memory_bytes` and
    `cpus` CPUs shown (cpus_shown): made once per such pair (the last 64 kept)."""
    make = {"meminfo": lambda: meminfo(memory_bytes), "stat": lambda: stat(cpus),
            "loadavg": lambda: LOADAVG, "cpuinfo": lambda: cpuinfo(cpus)}
    return tuple((name, make[name]()) for name in names)


class ProcView:
    """One sandbox's view files: a directory of its own (never shared: an inotify
    watch or a lock on a file another sandbox also reads would be a channel between
    them), made here and written again when a run's limits change what they say."""

    def __init__(self, directory: str, limits: Limits,
                 names: tuple[str, ...] = NAMES) -> None:
        self.dir = directory
        self.names = names
        """The files kept (of NAMES)."""
        self.shown: tuple[int, float] | None = None
        os.mkdir(directory, 0o755)
        self.show(limits)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def show(self, limits: Limits) -> None:
        """Make the files say `limits` (the memory limit, the CPU allowance) unless they
        say it already. Written in place: the sandbox's binds of them see the change."""
        key = (limits.memory_mb, limits.cpus)
        if key == self.shown:
            return
        self.shown = None  # unknown if a write fails
        for name, data in contents(limits.memory_bytes, cpus_shown(limits), self.names):
            fd = os.open(self.path(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                         | os.O_CLOEXEC | os.O_NOFOLLOW, 0o444)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        self.shown = key
