"""A session of an OCI-bundle tier (the `Sandbox` interface) and its runs.

The session owns a tmpfs workspace on the host and one long-lived container (oci.py's
`Container`) whose init is the fork server (forkserver.py). A run is a spec sent to the
fork server; its output arrives framed on the container's stdout and is counted here;
its wall time is timed here and its CPU time and memory read from the session's cgroup
every `POLL_S`; a limit passed sends the fork server a kill (every process but itself),
and if the fork server does not answer in `STOP_GRACE_S` the container is destroyed
(the next run starts a new one over the same files). Statuses are classified as the
namespace tier's (supervisor.py `Run._classify`).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trialbox.errors import SandboxStartError, SandboxUnavailable, UsageError
from trialbox.sandbox import mounts
from trialbox.sandbox.namespace import _check_pass_fds, run_environment
from trialbox.sandbox.oci import (DISK_SLACK, POLL_S, SANDBOX_UID, STOP_GRACE_S, Container,
                                  MiB, OciProvider)
from trialbox.sandbox.procview import ProcView
from trialbox.sandbox.supervisor import close_quietly
from trialbox.sandbox.uids import UidLease
from trialbox.types import ExecResult, ExecStatus, Limits

CARRY_ALL = 1 << 62


class OciSession:
    """A session in an OCI-runtime tier (`Sandbox` interface). Get one from a provider:
    `await provider.open(limits)`."""

    def __init__(self, provider: OciProvider, sid: str, limits: Limits):
        self.provider = provider
        self.tier = provider.tier
        self.sid = sid
        self.limits = limits
        self.dir = os.path.join(provider.dir, "s", sid)
        self.fs = os.path.join(self.dir, "fs")
        self.container: Container | None = None
        self.closed = False
        self._lock = asyncio.Lock()
        self._run: _Run | None = None
        self._refused = 0  # refused network attempts counted by containers destroyed
        self.lease: UidLease | None = None
        """The session's host uids (container tier: a block of uids.py's, userns.py)."""
        self.uid = SANDBOX_UID
        """Host uid of the workspace's files (the sandbox's uid 1000, as the host sees it:
        under gVisor 1000 itself, whose gofer writes them; in a container its slot's)."""
        self.view: ProcView | None = None
        """What the session reads in /proc/meminfo, /proc/stat, ... (procview.py)."""

    @property
    def workspace(self) -> str:
        return os.path.join(self.fs, "work")

    def make_workspace(self) -> None:
        if self.provider.engine.userns:
            self.lease = self.provider.lease_uids()
            self.uid = self.lease.first + SANDBOX_UID
        if self.provider.engine.proc_views:  # a random name: it shows in mountinfo
            self.view = ProcView(os.path.join(self.provider.views_dir,
                                              secrets.token_hex(8)), self.limits,
                                 self.provider.engine.proc_views)
        os.makedirs(self.fs)
        os.chmod(self.dir, 0o711)
        mounts.mount_tmpfs(self.fs, self.limits.disk_bytes, uid=0, mode=0o755)
        for name in ("work", "tmp", "shm"):
            p = os.path.join(self.fs, name)
            os.mkdir(p, 0o700)
            os.chown(p, self.uid, self.uid)

    def reshape(self, limits: Limits) -> None:
        """A warm session handed out with other limits: resize its workspace."""
        if limits.disk_bytes != self.limits.disk_bytes:
            opts = f"size={limits.disk_bytes}".encode()
            if mounts._libc.mount(b"tmpfs", self.fs.encode(), b"tmpfs",
                                  0x20 | mounts.MS_NOSUID | mounts.MS_NODEV, opts) != 0:
                raise SandboxStartError(f"could not resize the workspace to "
                                        f"{limits.disk_mb} MiB")
        self.limits = limits

    async def start_container(self) -> None:
        c = Container(self.provider, self.sid, self.dir, self.limits,
                      self.lease.first if self.lease is not None else 0,
                      self.view.dir if self.view is not None else "")
        self.container = c
        try:
            await c.start()
        except (OSError, subprocess.SubprocessError) as e:
            raise SandboxStartError(f"could not start a {self.provider.engine.name} "
                                    f"container: {e}") from e

    async def __aenter__(self) -> OciSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise UsageError("this sandbox session is closed; open a new one")

    # -- files (host side; links never followed) ------------------------------------
    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._check_open()
        try:
            mounts.write_file(self.workspace, path, data, self.uid, mode)
        except OSError as e:
            if e.errno == 28:
                raise UsageError(f"writing {path!r} ({len(data)} bytes) overflows the "
                                 f"workspace (Limits.disk_mb={self.limits.disk_mb}); raise "
                                 "disk_mb or write less") from e
            raise

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        self._check_open()
        try:
            return mounts.read_file(self.workspace, path, max_bytes)
        except FileNotFoundError as e:
            raise UsageError(f"no file {path!r} in the workspace") from e

    async def list_files(self) -> list[str]:
        self._check_open()
        return mounts.list_files(self.workspace)

    # -- lifecycle --------------------------------------------------------------------
    async def stop(self) -> None:
        if self._run is not None:
            self._run.kill(ExecStatus.SIGNAL, "stopped by the caller")

    async def network_refused(self) -> int:
        """Connection attempts (and other packets) outside `Limits.net_allow` refused so
        far in this session, counted outside the sandbox (network.py); 0 without an
        allow-list."""
        c = self.container
        if c is None or c.gate is None:
            return self._refused
        return self._refused + await asyncio.to_thread(c.gate.refused)

    async def park(self) -> None:
        """The container is the session's; between runs it holds only an idle fork
        server (no candidate process survives a run). Nothing to hand back."""

    async def close(self) -> None:
        """End the session. On a recycling tier (oci.Engine.recycle) a clean container
        is reset and kept warm for the next `open()` (oci.OciProvider.recycle); else,
        or when it is not fit to keep, it is destroyed with the session's files."""
        if self.closed:
            return
        await self.stop()
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            c, self.container = self.container, None
            kept = None
            try:
                if c is not None:
                    kept = await self.provider.recycle(self, c)
            finally:  # not kept (or the reset interrupted): destroyed with its files
                if kept is None:
                    await self.provider.loop.run_in_executor(None, self._teardown, c)
                self.provider.returned(self.sid)

    def wipe(self) -> None:
        """After the fork server emptied them from inside (forkserver.empty_files): check
        /workspace, /tmp and /dev/shm are empty (host side, links never followed; what
        is left is deleted), give them back their first owner and mode, and check that
        the tmpfs holds no space any more — what a recycled session's next attempt finds
        is what a new session has. Every process of the sandbox is dead by now."""
        for name in ("work", "tmp", "shm"):
            path = os.path.join(self.fs, name)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                for entry in os.listdir(fd):
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(entry, dir_fd=fd)
                    else:
                        os.unlink(entry, dir_fd=fd)
                if os.listdir(fd):
                    raise OSError(f"{path} is not empty after the wipe")
                os.fchown(fd, self.uid, self.uid)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        vfs = os.statvfs(self.fs)
        held = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        if held > DISK_SLACK:  # a file still open somewhere: the next attempt's disk
            raise OSError(f"{held} bytes of the emptied workspace are still held")

    def _teardown(self, c: Container | None) -> None:
        if c is not None:
            c.destroy()
            self._refused += c.refused
        if os.path.isdir(self.fs):
            for mp in mounts.mounts_under(self.fs):
                mounts.umount(mp)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.view is not None:
            shutil.rmtree(self.view.dir, ignore_errors=True)
            self.view = None
        if self.lease is not None:  # no process of the session is left to hold its uids
            self.lease.close()
            self.lease = None

    # -- runs -------------------------------------------------------------------------
    async def exec(self, argv: Sequence[str], *, stdin: bytes = b"",
                   limits: Limits | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = "/workspace",
                   pass_fds: Mapping[int, int] | None = None,
                   last: bool = False) -> ExecResult:
        self._check_open()
        targets = _check_pass_fds(pass_fds)
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a trialbox.types.Limits, got "
                             f"{type(limits).__name__}; e.g. Limits(wall_s=2)")
        limits = limits or self.limits
        if limits.network != self.limits.network:
            raise UsageError("Limits.network is fixed when the session opens; open a "
                             f"session with Limits(network={limits.network})")
        if limits.net_allow != self.limits.net_allow:
            raise UsageError("Limits.net_allow is fixed when the session opens; open a "
                             f"session with Limits(net_allow={limits.net_allow!r})")
        if not isinstance(stdin, (bytes, bytearray, memoryview)):
            raise UsageError(f"stdin must be bytes, got {type(stdin).__name__}")
        spec = self._spec(argv, env, cwd, limits)
        spec["fds"] = targets
        passed = [pass_fds[t] for t in targets] if pass_fds else []
        async with self._lock:
            try:
                self._check_open()
                return await self._exec(spec, bytes(stdin), limits, passed)
            finally:
                for fd in passed:  # ours to close once handed over (or on any failure)
                    close_quietly(fd)

    async def _exec(self, spec: dict[str, Any], stdin: bytes, limits: Limits,
                    passed: list[int]) -> ExecResult:
        had_fds = bool(passed)
        for _attempt in range(2):
            if self.container is None or not self.container.alive:
                if self.container is not None:
                    old, self.container = self.container, None
                    await self.provider.loop.run_in_executor(None, old.destroy)
                    self._refused += old.refused
                try:
                    await self.start_container()
                except (SandboxStartError, SandboxUnavailable, OSError) as e:
                    return self._infra(f"no sandbox could be started: {e}")
            assert self.container is not None
            run = _Run(self, self.container, spec, stdin, limits, passed)
            self._run = run
            try:
                result = await run.run()
            finally:
                self._run = None
            # Nothing of the candidate's ran: once more on a fresh container (unless
            # fds were passed: they went with the broken one).
            if run.started or result.status is not ExecStatus.INFRA or had_fds:
                break
        return result

    def _infra(self, message: str) -> ExecResult:
        return ExecResult(status=ExecStatus.INFRA, message=message,
                          runtime=self.provider.runtime.id, tier=self.tier)

    def _spec(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str,
              limits: Limits) -> dict[str, Any]:
        run_env = run_environment(argv, env, self.provider.env)
        self._check_cwd(cwd)
        rl = self.provider.run_rlimits(limits)
        rl["RLIMIT_NPROC"] = [limits.pids, limits.pids]
        prog = argv[0]
        python = prog in self.provider.python_names and len(argv) >= 2 and (
            argv[1] == "-c" and len(argv) >= 3 or not argv[1].startswith("-"))
        return {"mode": "python" if python else "exec",
                "argv": list(argv), "path": _resolve(list(argv), run_env["PATH"]),
                "env": run_env, "cwd": cwd, "uid": SANDBOX_UID, "gid": SANDBOX_UID,
                "rlimits": rl, "oom_score_adj": None}

    def _check_cwd(self, cwd: str) -> None:
        if not isinstance(cwd, str) or "\x00" in cwd:
            raise UsageError(f"cwd must be a string, got {cwd!r}")
        parts = [p for p in cwd.split("/") if p not in ("", ".")]
        if ".." in parts or not parts or parts[0] not in ("workspace", "tmp"):
            raise UsageError(f"cwd must be /workspace, a directory under it, or /tmp "
                             f"(no '..'); got {cwd!r}")
        host = "work" if parts[0] == "workspace" else "tmp"
        try:
            fd = mounts._open_dir_chain(os.path.join(self.fs, host), parts[1:], False, 0)
        except (FileNotFoundError, NotADirectoryError, UsageError) as e:
            raise UsageError(f"cwd {cwd!r} is not a directory in the session (create it "
                             "first, e.g. with mkdir in an earlier run)") from e
        os.close(fd)


def _resolve(argv: list[str], path_var: str) -> str:
    """The program's path inside the sandbox (whose /usr is the host's, read-only)."""
    prog = argv[0]
    if "/" in prog:
        if prog.startswith(("/workspace/", "/tmp/")) or not prog.startswith("/"):
            return prog
        if prog.startswith(("/usr/", "/bin/", "/sbin/", "/lib")) and os.path.exists(prog):
            return prog
        raise UsageError(f"command {prog!r} does not exist in the sandbox runtime (only "
                         "/usr and the workspace are visible)")
    for d in path_var.split(":"):
        if d.startswith("/usr/") or d in ("/bin", "/sbin"):
            cand = os.path.join(d, prog)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
    raise UsageError(f"command {prog!r} not found on the sandbox PATH ({path_var}); "
                     "give an absolute path or install it in the runtime")


class _Run:
    """One run in one session's container: send, read, time, kill, measure, classify."""

    def __init__(self, sb: OciSession, c: Container, spec: dict[str, Any], stdin: bytes,
                 limits: Limits, passed: list[int]):
        self.sb, self.c, self.spec, self.stdin, self.limits = sb, c, spec, stdin, limits
        self.passed = passed
        self.loop = sb.provider.loop
        self.out, self.err = bytearray(), bytearray()
        self.out_total = self.err_total = 0
        self.started = False
        self.status: int | None = None
        self.error = ""
        self.kill_reason: ExecStatus | None = None
        self.kill_message = ""
        self.t_go = self.t_end = 0.0
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.base_usage = 0
        self.peak = 0
        self.oom_base = 0
        self.disk_used0 = 0
        self.memory_stop = False
        """The run was stopped for memory (reported `memory`, or `disk` when its files
        filled that memory)."""
        self._timer: asyncio.TimerHandle | None = None

    def kill(self, reason: ExecStatus, message: str) -> None:
        if self.kill_reason is None and self.status is None and not self.done.done():
            self.kill_reason, self.kill_message = reason, message
            self.t_end = time.monotonic()
            try:
                self.c.send((b"K", b""))
            except (OSError, SandboxStartError):
                self.c.dead = True

    def _frame(self, tag: bytes, payload: bytes) -> None:
        cap = self.limits.output_bytes
        if tag == b"O" or tag == b"E":
            buf = self.out if tag == b"O" else self.err
            if tag == b"O":
                self.out_total += len(payload)
            else:
                self.err_total += len(payload)
            room = cap - len(buf)
            if room > 0:
                buf += payload[:room]
            if max(self.out_total, self.err_total) > cap:
                self.kill(ExecStatus.OUTPUT, f"output passed Limits.output_bytes={cap}")
        elif tag == b"S":
            self.started = True
        elif tag == b"X":
            msg = json.loads(payload)
            if "error" in msg:
                self.error = msg["error"]
            else:
                self.status = msg["status"]
            if not self.t_end:
                self.t_end = time.monotonic()
            if not self.done.done():
                self.done.set_result(None)

    def _eof(self) -> None:
        if not self.t_end:
            self.t_end = time.monotonic()
        if not self.done.done():
            self.done.set_result(None)

    async def run(self) -> ExecResult:
        c, limits = self.c, self.limits
        files = c.files
        assert files is not None
        try:
            # Everything the sandbox holds when the run starts is carried (not charged
            # to the run): the fork server, gVisor's Sentry, the workspace's pages. Its
            # processes are all killed between runs, so what it carries is bounded.
            files.begin_run(self.sb.provider.host_limits(limits), carry=CARRY_ALL)
            if self.sb.view is not None:  # what /proc/meminfo, ... say: this run's limits
                self.sb.view.show(limits)
            self.base_usage = files.base.usage_bytes
            self.oom_base = files.base.oom_kills
            self.disk_used0 = self._disk_used()
        except OSError as e:
            c.dead = True
            return self.sb._infra(f"could not set the session's cgroup limits: {e}")
        c.on_frame, c.on_eof = self._frame, self._eof
        self.t_go = time.monotonic()
        try:
            c.send((b"R", json.dumps(self.spec).encode()), (b"I", self.stdin),
                   fds=self.passed)
        except (OSError, SandboxStartError) as e:
            c.dead = True
            c.on_frame = c.on_eof = None
            return self.sb._infra(f"could not start the run: {e}")
        for fd in self.passed:  # handed over: EOF on their peers now means the run is gone
            close_quietly(fd)
        self.passed.clear()
        self._timer = self.loop.call_later(POLL_S, self._poll)
        try:
            try:
                await asyncio.wait_for(asyncio.shield(self.done), limits.wall_s)
            except TimeoutError:
                self.kill(ExecStatus.TIMEOUT, f"wall time passed Limits.wall_s={limits.wall_s}")
                try:
                    await asyncio.wait_for(asyncio.shield(self.done), STOP_GRACE_S)
                except TimeoutError:  # the fork server did not answer: drop it all
                    c.dead = True
                    await self.loop.run_in_executor(None, c.destroy)
        finally:
            c.on_frame = c.on_eof = None
            if self._timer is not None:
                self._timer.cancel()
        return self._result()

    def _poll(self) -> None:
        """CPU (the cgroup's total: every process of the run, and gVisor's kernel working
        for it) and memory, from outside."""
        files = self.c.files
        if files is None or self.done.done():
            return
        try:
            now = files.snapshot()
        except OSError:
            return
        self.peak = max(self.peak, now.usage_bytes - self.base_usage)
        if now.cpu_ns - files.base.cpu_ns > self.limits.cpu_s * 1e9:
            self.kill(ExecStatus.TIMEOUT, f"CPU time passed Limits.cpu_s={self.limits.cpu_s}")
            return
        if self.peak > self.limits.memory_bytes:
            self.kill(ExecStatus.MEMORY, f"memory passed Limits.memory_mb="
                                         f"{self.limits.memory_mb}")
            return
        self._timer = self.loop.call_later(POLL_S, self._poll)

    def _result(self) -> ExecResult:
        stats = None
        oom = 0
        if self.c.files is not None:
            try:
                stats = self.c.files.end_run()
                oom = stats.oom_kills
                self.peak = max(self.peak, stats.peak_bytes)
            except OSError:
                stats = None
        end = self.t_end or time.monotonic()
        status, code, sig, message = self._classify(oom, stats.cpu_ns if stats else 0)
        if self.memory_stop or self.c.dead:  # a gVisor sandbox stopped for memory: not kept
            self.c.dead = self.c.dead or self.sb.provider.engine.name == "runsc"
        return ExecResult(
            status=status, exit_code=code, signal=sig, message=message,
            stdout=bytes(self.out), stderr=bytes(self.err),
            truncated=self.out_total > len(self.out) or self.err_total > len(self.err),
            wall_ms=round((end - self.t_go) * 1e3, 3),
            cpu_ms=round(stats.cpu_ns / 1e6, 3) if stats else 0.0,
            peak_memory_bytes=max(0, self.peak), runtime=self.sb.provider.runtime.id,
            tier=self.sb.tier)

    def _classify(self, oom_kills: int, cpu_ns: int
                  ) -> tuple[ExecStatus, int | None, int | None, str]:
        if self.error:
            return ExecStatus.INFRA, None, None, f"sandbox machinery failed: {self.error}"
        if not self.started and self.kill_reason is None:
            return (ExecStatus.INFRA, None, None, "the sandbox died before the program "
                    f"started: {self.c.log_tail()}")
        if oom_kills and self.kill_reason in (None, ExecStatus.MEMORY):
            return self._memory_result()
        if self.kill_reason is ExecStatus.MEMORY:
            return self._memory_result()
        if self.kill_reason is not None:
            return self.kill_reason, None, 9, self.kill_message
        st = self.status
        if st is None:
            # The sandbox died with the run. INFRA only when nothing outside the
            # candidate says it did it (DESIGN.md decision 1): memory near the cap at the
            # last poll, or its workspace — a tmpfs read from the host after the death —
            # full or holding half the memory limit (under load the poll can miss the
            # climb, and the cgroup's kill can take the sandbox's init with the run).
            written = self._disk_used() - self.disk_used0
            if self._disk_full():
                return (ExecStatus.DISK, None, 9,
                        f"workspace full (Limits.disk_mb={self.sb.limits.disk_mb})")
            if self.peak > 0.8 * self.limits.memory_bytes \
                    or written * 2 >= self.limits.memory_bytes:
                return self._memory_result()
            return (ExecStatus.INFRA, None, None,
                    f"the sandbox died during the run: {self.c.log_tail()}")
        if os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            cpu_hit = cpu_ns >= 0.95 * max(1.0, self.limits.cpu_s) * 1e9
            if sig in (9, 24) and cpu_hit:
                return (ExecStatus.TIMEOUT, None, sig,
                        f"CPU time passed Limits.cpu_s={self.limits.cpu_s}")
            if sig == 25 and self._disk_full():
                return ExecStatus.DISK, None, sig, "file size passed Limits.disk_mb"
            return ExecStatus.SIGNAL, None, sig, f"killed by signal {sig}"
        code = os.WEXITSTATUS(st)
        if code == 0:
            return ExecStatus.OK, 0, None, ""
        if self._disk_full():
            return (ExecStatus.DISK, code, None,
                    f"workspace full (Limits.disk_mb={self.limits.disk_mb})")
        return ExecStatus.EXIT, code, None, f"exit status {code}"

    def _memory_result(self) -> tuple[ExecStatus, int | None, int | None, str]:
        """A run stopped for memory, and why. The session's files live in a tmpfs whose
        pages are charged to its cgroup (and, under gVisor, to the Sentry's page cache on
        their way there): when the files the run wrote took at least half of its memory
        limit it was filling its disk (with `disk_mb` above what memory leaves for
        files, the memory limit ends it before the tmpfs is full), and the feedback says
        so — the namespace tier's rule (supervisor.Run._oom_cause), so every tier names
        the same cause."""
        self.memory_stop = True
        written = self._disk_used() - self.disk_used0
        if written * 2 >= self.limits.memory_bytes:
            return (ExecStatus.DISK, None, 9,
                    f"workspace files ({written / MiB:.1f} MiB written) filled the memory "
                    f"they are kept in (Limits.memory_mb={self.limits.memory_mb}, below "
                    f"Limits.disk_mb={self.sb.limits.disk_mb})")
        return (ExecStatus.MEMORY, None, 9,
                f"memory passed Limits.memory_mb={self.limits.memory_mb}")

    def _disk_used(self) -> int:
        """Bytes in use in the session's tmpfs (workspace, /tmp, /dev/shm)."""
        try:
            st = os.statvfs(self.sb.fs)
        except OSError:
            return 0
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def _disk_full(self) -> bool:
        try:
            st = os.statvfs(self.sb.fs)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < DISK_SLACK
