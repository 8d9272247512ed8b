"""Run supervision in the namespace tier: one run of a session in its cell, from `go`
to a classified `ExecResult`.

The supervisor (this module, in the project's process) hands the cell's init the run's
stdin, pipes and spec, then watches from outside: it reads stdout/stderr up to the cap,
enforces wall time and output size (kill), polls the cell cgroup's CPU time (a run split
over many processes still hits `cpu_s`), and when the init reports the exit — only after
every process of the run is dead — reads CPU, peak memory and OOM kills from the cgroup
and classifies the outcome (`Run._classify`): the candidate's statuses (exit, signal,
timeout, memory, disk, output) apart from the machinery's (`infra`). Nothing the
candidate says about itself is used. The session around it is namespace.py's.
"""

from __future__ import annotations

import asyncio
import math
import os
import struct
import time
from typing import TYPE_CHECKING

from trialbox.errors import SandboxStartError
from trialbox.sandbox.cgroups import OverBudget
from trialbox.sandbox.zygote_client import Cell, FdReader
from trialbox.types import ExecResult, ExecStatus, Limits

if TYPE_CHECKING:
    from trialbox.sandbox.namespace import NamespaceSandbox

MiB = 1 << 20
SIGNALS_OF_TIMEOUT = (24,)  # SIGXCPU: RLIMIT_CPU ran out
DISK_SLACK = 64 * 1024
INODE_BYTES = 1024
"""Kernel memory allowed per tmpfs inode (a shmem inode and its dentry: under 1 KiB)."""
MIN_INODES = 4096
CPU_POLL_S = 0.05
OUTPUT_GRACE_S = 0.2
"""How long the output pipes may stay open once every process of a run is gone."""


def session_inodes(limits: Limits) -> int:
    """Files, directories and links a session's tmpfs may hold: one per 4 KiB of
    `disk_mb` (a file of one byte takes a page anyway), at least MIN_INODES. Without a
    bound, millions of empty files pass `disk_mb` untouched and hold kernel memory."""
    return max(MIN_INODES, limits.disk_bytes // 4096)


def session_carry(limits: Limits) -> int:
    """The most memory a session's files may hold between runs (their pages, bounded by
    the tmpfs's size, and their inodes): what a run's memory limit allows on top of
    `memory_mb` (cgroups.CellFiles.begin_run)."""
    return limits.disk_bytes + session_inodes(limits) * INODE_BYTES


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class Run:
    """One run in one cell: feed, read, time, kill, measure, classify."""

    def __init__(self, sb: NamespaceSandbox, cell: Cell, spec: dict[str, object],
                 stdin: bytes, limits: Limits, passed: list[int], last: bool = False):
        self.sb, self.cell, self.spec, self.stdin, self.limits = sb, cell, spec, stdin, limits
        self.passed = passed
        self.last = last
        self.pool = sb.pool
        self.loop = self.pool.loop
        self.kill_reason: ExecStatus | None = None
        self.kill_message = ""
        self.t_go = 0.0
        self.t_exit: float | None = None
        self.started = False
        self.wait_status: int | None = None
        self.readers: list[FdReader] = []
        self.disk_used0 = 0
        self.held_open = False
        """Something outside the run's processes held an output pipe open past its end."""
        self._cpu_timer: asyncio.TimerHandle | None = None
        self._exited: asyncio.Future[None] | None = None

    def kill(self, reason: ExecStatus, message: str) -> None:
        if self.kill_reason is None and self.wait_status is None:
            self.kill_reason, self.kill_message = reason, message
            self.t_exit = time.monotonic()
            self.cell.stop()

    def _on_status(self, cell: Cell) -> None:
        """Parse the cell's status records: R(eady) S(tarted) X(exit)+int32 E(rror)+text."""
        assert cell.status is not None
        self._parse_status(cell)
        if (self.wait_status is not None or cell.status.done.done()) and \
                self._exited is not None and not self._exited.done():
            self._exited.set_result(None)

    def _parse_status(self, cell: Cell) -> None:
        assert cell.status is not None
        buf, i = bytes(cell.status.buf), 0
        while i < len(buf):
            tag = buf[i:i + 1]
            if tag == b"X":
                if len(buf) < i + 5:
                    return
                if self.wait_status is None:
                    self.wait_status = struct.unpack("<i", buf[i + 1:i + 5])[0]
                    if self.t_exit is None:
                        self.t_exit = time.monotonic()
                i += 5
            elif tag == b"S":
                self.started = True
                i += 1
            elif tag == b"R":
                i += 1
            elif tag == b"E":  # E + uint16 length + text: the machinery failed
                if len(buf) < i + 3:
                    return
                n = struct.unpack("<H", buf[i + 1:i + 3])[0]
                if len(buf) < i + 3 + n:
                    return
                cell.error = buf[i + 3:i + 3 + n].decode(errors="replace")
                i += 3 + n
            else:  # garbage: the machinery failed
                cell.error = f"unexpected status bytes {buf[i:i + 32]!r}"
                return

    def _on_output(self, reader: FdReader) -> None:
        if reader.total > self.limits.output_bytes:
            self.kill(ExecStatus.OUTPUT, f"output passed Limits.output_bytes="
                                         f"{self.limits.output_bytes}")

    async def run(self) -> ExecResult:
        cell, limits = self.cell, self.limits
        assert cell.status is not None
        fds: list[int] = []
        try:
            files = cell.open_files()  # closed between runs on a dense pool
            try:
                files.begin_run(limits, session_carry(self.sb.limits))
            except OverBudget as e:
                return self._over_budget(e)
            if cell.view is not None:  # what /proc/meminfo, ... say: this run's limits
                cell.view.show(limits)
            self.disk_used0 = self._disk_used()
            # stdin is a file of this run's own, empty when there is no input. It was a
            # dup of the pool's one open /dev/null: the host's inode (a watch on
            # /proc/self/fd/0 saw the host's writes to /dev/null) and one open file
            # shared by every run (flags set with F_SETFL showed in other sessions').
            stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
            fds.append(stdin_fd)
            if self.stdin:
                os.write(stdin_fd, self.stdin)
                os.lseek(stdin_fd, 0, os.SEEK_SET)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            fds += [out_w, err_w]
        except (OSError, SandboxStartError) as e:
            for fd in fds:
                os.close(fd)
            return self.sb._infra(f"could not prepare the run: {e}")
        cell.status.buf = bytearray()  # this run's records only
        cell.on_status = self._on_status
        cap = limits.output_bytes
        self.readers = [FdReader(self.loop, out_r, cap, self._on_output),
                        FdReader(self.loop, err_r, cap, self._on_output)]
        self.t_go = time.monotonic()
        trees = cell.trees
        try:  # the session's first run in this cell: attach its workspace first (M)
            # lower case: the session's last run, no candidate to fork ahead after it
            # (one killed unused at the reset cost ~1 ms; under load the reset often
            # came after the cell's grace period)
            tag = b"M" if trees else b"G"
            cell.send(tag.lower() if self.last else tag, self.spec,
                      fds + self.passed + trees)
        except (OSError, SandboxStartError) as e:
            self.kill_reason, self.kill_message = ExecStatus.INFRA, f"could not start: {e}"
            cell.kill()
        else:
            # Handed over: drop ours now, so the peer sees EOF when the program is gone.
            for fd in self.passed:
                close_quietly(fd)
            self.passed.clear()
        finally:
            for fd in fds + trees:
                os.close(fd)
            cell.trees = []  # sent, or the cell is broken and dropped with them
        self._cpu_timer = self.loop.call_later(CPU_POLL_S, self._check_cpu)
        try:
            # The run is over when the cell reported the exit (every process of the run
            # is dead by then: the cell's init, pid 1 of its namespace, reports only
            # after killing and reaping them all), or the cell itself died.
            self._exited = self.loop.create_future()
            self._on_status(cell)
            done, _ = await asyncio.wait([self._exited], timeout=limits.wall_s)
            if not done:
                self.kill(ExecStatus.TIMEOUT, f"wall time passed Limits.wall_s={limits.wall_s}")
                done, _ = await asyncio.wait([self._exited], timeout=10)
                if not done:
                    cell.kill()
                    await asyncio.wait([self._exited], timeout=5)
                    for r in self.readers:
                        r.close()
                    return self.sb._infra("the sandbox did not terminate after being "
                                          "killed")
            # With no process left, what the program wrote is in the pipes and EOF
            # follows at once — unless a reference outside its process tree holds a
            # write end open (a descriptor cycle in flight on a Unix socket, or one
            # handed over a passed fd). The run ends anyway: what is in the pipes is
            # read, the rest is not waited for, and the cell is not reused.
            pending = [r.done for r in self.readers if not r.done.done()]
            if pending:
                _, pending_left = await asyncio.wait(pending, timeout=OUTPUT_GRACE_S)
                if pending_left:
                    for r in self.readers:
                        r.drain()
                        r.close()
                    self.held_open = True
        finally:
            cell.on_status = None
            if self._cpu_timer is not None:
                self._cpu_timer.cancel()
        return self._result()

    def _over_budget(self, e: OverBudget) -> ExecResult:
        return ExecResult(
            status=ExecStatus.MEMORY, peak_memory_bytes=e.held,
            message=f"not started: the session already holds {e.held / MiB:.1f} MiB left "
                    f"by its earlier runs (SysV shared memory, files...), more than a run "
                    f"may start with under Limits.memory_mb={self.limits.memory_mb} and "
                    f"the workspace (Limits.disk_mb={self.sb.limits.disk_mb})",
            runtime=self.pool.runtime.id, tier=self.sb.tier)

    def _check_cpu(self) -> None:
        """RLIMIT_CPU is per process; the cgroup's total catches a run split over many."""
        files = self.cell.files
        if files is None or self.wait_status is not None:
            return
        try:
            cpu_ns = files.snapshot().cpu_ns - files.base.cpu_ns
        except OSError:
            return
        if cpu_ns > self.limits.cpu_s * 1e9:
            self.kill(ExecStatus.TIMEOUT, f"CPU time passed Limits.cpu_s={self.limits.cpu_s}")
            return
        self._cpu_timer = self.loop.call_later(CPU_POLL_S, self._check_cpu)

    def _result(self) -> ExecResult:
        end = self.t_exit if self.t_exit is not None else time.monotonic()
        wall_ms = (end - self.t_go) * 1e3
        try:
            stats = self.cell.files.end_run() if self.cell.files is not None else None
        except OSError:
            stats = None
        out, err = self.readers
        common = dict(
            stdout=bytes(out.buf), stderr=bytes(err.buf),
            truncated=out.total > len(out.buf) or err.total > len(err.buf),
            wall_ms=round(wall_ms, 3),
            cpu_ms=round(stats.cpu_ns / 1e6, 3) if stats else 0.0,
            peak_memory_bytes=stats.peak_bytes if stats else 0,
            runtime=self.pool.runtime.id, tier=self.sb.tier)
        status, code, sig, message = self._classify(stats.oom_kills if stats else 0,
                                                    stats.cpu_ns if stats else 0)
        return ExecResult(status=status, exit_code=code, signal=sig, message=message,
                          **common)  # type: ignore[arg-type]

    def _classify(self, oom_kills: int, cpu_ns: int
                  ) -> tuple[ExecStatus, int | None, int | None, str]:
        if not self.started:
            cause = self.cell.error or (self.kill_message if self.kill_reason else "") \
                or "the sandbox failed before the program started"
            return ExecStatus.INFRA, None, None, f"sandbox setup failed: {cause}"
        reason = self.kill_reason
        if reason in (ExecStatus.TIMEOUT, ExecStatus.OUTPUT, ExecStatus.INFRA,
                      ExecStatus.SIGNAL):
            assert reason is not None
            return reason, None, 9, self.kill_message
        st = self.wait_status
        if st is None:
            return (ExecStatus.INFRA, None, None,
                    "the sandbox's init exited without reporting the program's status")
        if os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            if oom_kills:
                status, message = self._oom_cause()
                return status, None, sig, message
            # SIGXCPU / SIGXFSZ count as limits only when the limit was really reached
            # (a program may raise them itself).
            cpu_hit = cpu_ns >= 0.95 * math.floor(max(1.0, self.limits.cpu_s)) * 1e9
            if (sig in SIGNALS_OF_TIMEOUT or sig == 9) and cpu_hit:
                return (ExecStatus.TIMEOUT, None, sig,
                        f"CPU time passed Limits.cpu_s={self.limits.cpu_s}")
            if sig == 25 and self._disk_full():  # SIGXFSZ
                return ExecStatus.DISK, None, sig, "file size passed Limits.disk_mb"
            return ExecStatus.SIGNAL, None, sig, f"killed by signal {sig}"
        code = os.WEXITSTATUS(st)
        if code == 0:
            note = "a process of the run was OOM-killed" if oom_kills else ""
            return ExecStatus.OK, 0, None, note
        if oom_kills:
            status, message = self._oom_cause()
            return status, code, None, message
        if self._disk_full():
            return (ExecStatus.DISK, code, None,
                    f"workspace full (Limits.disk_mb={self.limits.disk_mb})")
        return ExecStatus.EXIT, code, None, f"exit status {code}"

    def _oom_cause(self) -> tuple[ExecStatus, str]:
        """An OOM kill's cause. The workspace is a tmpfs whose pages are charged to the
        cell's memory: when the files the run wrote took at least half of its memory
        limit, it was filling its disk (with `disk_mb` above what memory leaves for
        files, the OOM killer fires before the tmpfs is full), and the feedback says so."""
        written = self._disk_used() - self.disk_used0
        if written * 2 >= self.limits.memory_bytes:
            return (ExecStatus.DISK,
                    f"workspace files ({written / MiB:.1f} MiB written) filled the memory "
                    f"they are kept in (Limits.memory_mb={self.limits.memory_mb}, below "
                    f"Limits.disk_mb={self.sb.limits.disk_mb})")
        return ExecStatus.MEMORY, f"memory passed Limits.memory_mb={self.limits.memory_mb}"

    def _disk_used(self) -> int:
        """Bytes in use in the session's tmpfs (workspace, /tmp, /dev/shm)."""
        try:
            st = os.statvfs(self.sb.dir)
        except OSError:
            return 0
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def _disk_full(self) -> bool:
        try:
            st = os.statvfs(self.sb.dir)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < DISK_SLACK
