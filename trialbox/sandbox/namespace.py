"""The `namespace` tier: the embedded default. Sessions start from warm cells (pool.py).

Per session: a size-limited tmpfs on the host (`work/`, `tmp/`, `shm/`) owned by a uid
of its own, and a cell taken from the warm pool at the first run: fresh namespaces and a
cgroup, into which those three directories are attached (detached clones made with
open_tree). Per run: a candidate process forked ahead of time in the cell drops to the
session's uid inside a new user namespace and runs; when it exits every other process of
the run is killed before the result is reported. The supervisor (supervisor.py `Run`)
feeds stdin, reads stdout/stderr up to the cap, enforces wall time and output size, and
reads CPU and memory from the cell's cgroup; nothing the candidate says about itself is
used. This module holds the session: its files, its cell, the checks on a run's input.
Closing the session unmounts the tmpfs and hands the cell back to the pool, which resets
it (no process, no mount, new IPC and network namespaces) or destroys it: nothing
reaches the next session.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping, Sequence
from typing import cast

from trialbox.errors import SandboxStartError, UsageError, ZygoteDied
from trialbox.sandbox import mounts, snapshot
from trialbox.sandbox.network import Gate, check_node
from trialbox.sandbox.pool import CellPool
from trialbox.sandbox.supervisor import Run, close_quietly, session_carry, session_inodes
from trialbox.sandbox.zygote_client import BASE_ENV, Cell
from trialbox.telemetry import traced_acquire, traced_exec
from trialbox.types import ExecResult, ExecStatus, Limits

__all__ = ["NamespaceSandbox", "SPEC_MAX", "run_environment", "session_carry",
           "session_inodes"]

SESSION_DIRS = ["work", "tmp", "shm"]
def run_environment(argv: Sequence[str], env: Mapping[str, str] | None,
                    base: Mapping[str, str] = BASE_ENV) -> dict[str, str]:
    """A run's environment: `base` (the pool's: BASE_ENV, plus an image's [env]) and
    the caller's `env` over it, once argv and env are checked (every tier's `exec` takes
    them the same way). UsageError names the fix."""
    if isinstance(argv, (str, bytes)) or not argv:
        raise UsageError("argv must be a non-empty list of strings, e.g. "
                         "['python3', 'main.py']")
    for a in argv:
        if not isinstance(a, str) or "\x00" in a:
            raise UsageError(f"every argv item must be a str without NUL, got {a!r}")
    run_env = dict(base)
    for k, v in (env or {}).items():
        if (not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k
                or "\x00" in k + v):
            raise UsageError(f"env entries must be str -> str, keys without '=' or "
                             f"NUL; got {k!r}: {v!r}")
        run_env[k] = v
    return run_env


class NamespaceSandbox:
    """A session in the namespace tier. Create with `await NamespaceSandbox.open(pool)`."""

    tier = "namespace"

    def __init__(self, pool: CellPool, limits: Limits,
                 base: Sequence[snapshot.Layer] = ()):
        self.pool = pool
        self.limits = limits
        self.uid = -1
        self.dir = ""
        self.layers = [layer.acquire() for layer in base]
        """Frozen layers the session's files stand on, top first (snapshot.py); none
        for a session on a plain tmpfs."""
        self.upper = -1
        """With layers: the tmpfs (a detached mount fd) holding what the session wrote."""
        self.mount_sources: list[str] = []
        self.cell: Cell | None = None
        self.closed = False
        self._lock = asyncio.Lock()
        self._current: Run | None = None
        self._stop_pending = False  # stop() came while a run was being set up
        self.gate: Gate | None = None
        """The cell's allow-listed way out (network.py), with `Limits.net_allow` only."""
        self._refused = 0  # refused network attempts counted by gates already closed
        self._admitted = False  # holds one of the pool's places (capacity.py)

    @classmethod
    async def open(cls, pool: CellPool, limits: Limits | None = None,
                   base: Sequence[snapshot.Layer] = ()) -> NamespaceSandbox:
        """A new session; on `base` (a snapshot's layers, top first) it starts with
        their files, copy-on-write (Snapshot.open)."""
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a trialbox.types.Limits, got "
                             f"{type(limits).__name__}; e.g. Limits(wall_s=2)")
        if pool.image_guard is not None:  # the image's cheap check (image_verify.py)
            await pool.image_guard.before_task()
        if limits is not None and limits.net_allow:
            check_node()
        sb = cls(pool, limits or Limits(), base)
        try:
            if pool.admission is not None:  # past the node's capacity: wait for a place
                await pool.admission.enter()
                sb._admitted = True
            sb._open_session()
        except BaseException:
            sb._teardown()  # its layers, uid, workspace, place: idempotent
            raise
        return sb

    def _leave(self) -> None:
        if self._admitted and self.pool.admission is not None:
            self._admitted = False
            self.pool.admission.leave()

    def _open_session(self) -> None:
        self.uid = self.pool.take_uid()
        try:
            self.dir = self.pool.take_session_dir()
        except OSError as e:
            self._teardown()
            raise SandboxStartError(f"could not create the session workspace: {e}") from e
        self.mount_sources = [os.path.join(self.dir, name) for name in SESSION_DIRS]
        if self.layers:
            try:
                self.upper = snapshot.mount_fork(self.dir, self.layers, self.uid,
                                                 self.limits.disk_bytes,
                                                 session_inodes(self.limits))
            except OSError as e:
                self._teardown()
                raise SandboxStartError(f"could not mount the session over its "
                                        f"snapshot: {e}") from e
            return
        try:
            mounts.mount_tmpfs(self.dir, self.limits.disk_bytes, uid=0, mode=0o755,
                               inodes=session_inodes(self.limits))
            for name in SESSION_DIRS:
                p = os.path.join(self.dir, name)
                os.mkdir(p, 0o700)
                os.chown(p, self.uid, self.uid)
        except OSError as e:
            self._teardown()
            raise SandboxStartError(f"could not create the session workspace: {e}") from e

    @property
    def workspace(self) -> str:
        """Host path of the workspace (for the supervisor's own reads; never follow links)."""
        return os.path.join(self.dir, "work")

    async def __aenter__(self) -> NamespaceSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def stop(self) -> None:
        """Kill the run in flight, if any (every process of it); its `exec` returns with
        status `signal` and the message "stopped by the caller". The session stays open."""
        if self._current is not None:
            self._current.kill(ExecStatus.SIGNAL, "stopped by the caller")
        elif self._lock.locked():
            # A run is being set up (waiting for a cell: seconds on a slow kernel or a
            # loaded host): it must not start, or close() would wait for all of it.
            self._stop_pending = True

    async def close(self) -> None:
        """End the session. A run in flight is stopped first (its `exec` returns with
        status `signal`, "stopped by the caller")."""
        if self.closed:
            return
        await self.stop()
        async with self._lock:
            self._teardown()

    def _teardown(self) -> None:
        self.closed = True
        if self.cell is not None:
            self._hand_back(recycle=True)
        if self.dir:  # unmounted off the event loop; the uid is free after that
            self.pool.retire_session(self.dir, self.uid)
            self.dir, self.uid = "", -1
        if self.uid >= 0:
            self.pool.give_uid(self.uid)
            self.uid = -1
        if self.upper >= 0:  # the overlay keeps its own reference while it lingers
            os.close(self.upper)
            self.upper = -1
        for layer in self.layers:
            layer.release()
        self.layers = []
        self._leave()

    async def park(self) -> None:
        """Hand the session's cell back to the pool while keeping its files: called while
        the model thinks, so an idle episode holds a tmpfs, not a process and a cgroup.
        The next `exec` takes a warm cell and attaches the same workspace (~1 ms). A run
        in flight is waited for, not killed. Processes never outlive a run anyway, so
        nothing but the files is carried across a park."""
        if self.closed:
            return
        async with self._lock:
            if self.cell is not None:
                self._hand_back(recycle=True)

    async def snapshot(self) -> snapshot.Snapshot:
        """Freeze the session's files (workspace, /tmp, /dev/shm) as they are after the
        run in flight, if any: the state `fork`s start from (docs/snapshots.md). O(1) in
        their size. The session carries on (on a copy-on-write layer over them); its
        next run takes a fresh cell. UsageError on a closed session."""
        return await snapshot.take(self)

    async def fork(self, n: int, limits: Limits | None = None) -> list[NamespaceSandbox]:
        """`n` new sessions starting from this one's files as they are now (a snapshot,
        forked `n` ways, then released: the forks keep what they use). Each is
        independent, outlives this session, and may write `disk_mb` (`limits`, default
        this session's) on top of what it starts with."""
        async with await self.snapshot() as snap:
            return await snap.fork(n, limits)

    @property
    def parked(self) -> bool:
        """True when the session holds no cell (before its first run, or after park())."""
        return self.cell is None

    # ------------------------------------------------------------------ files
    def _check_open(self) -> None:
        if self.closed:
            raise UsageError("this sandbox session is closed; open a new one")

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._check_open()
        try:
            mounts.write_file(self.workspace, path, data, self.uid, mode)
        except OSError as e:
            if e.errno == 28:  # ENOSPC: no room, or no inode left (session_inodes)
                raise mounts.WorkspaceFull(
                    f"writing {path!r} ({len(data)} bytes) overflows the workspace "
                    f"(Limits.disk_mb={self.limits.disk_mb}, at most "
                    f"{session_inodes(self.limits):,} files); raise disk_mb or write "
                    "less") from e
            raise

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        self._check_open()
        try:
            return mounts.read_file(self.workspace, path, max_bytes)
        except FileNotFoundError as e:
            raise UsageError(f"no file {path!r} in the workspace") from e

    async def list_files(self) -> list[str]:
        """See Sandbox.list_files; bounded (mounts.LIST_MAX entries, LIST_DEPTH levels:
        a UsageError past them) and walked in a thread, never on the event loop (a
        candidate's 200,000 files took 0.8 s to list)."""
        self._check_open()
        return await asyncio.to_thread(mounts.list_files, self.workspace)

    # ------------------------------------------------------------------ runs
    @traced_exec  # span sandbox.exec, runs by status, wall time (telemetry)
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
            raise UsageError("Limits.network is fixed when the session opens (it shapes "
                             "the session's namespaces); open a session with "
                             f"Limits(network={limits.network})")
        if limits.net_allow != self.limits.net_allow:
            raise UsageError("Limits.net_allow is fixed when the session opens; open a "
                             f"session with Limits(net_allow={limits.net_allow!r})")
        # disk_mb is the size of the session's workspace, set at open; a run's own
        # disk_mb only bounds single files (RLIMIT_FSIZE).
        spec = self._spec(argv, env, cwd, limits)
        spec["fds"] = targets
        _check_spec_size(spec)
        if not isinstance(stdin, (bytes, bytearray, memoryview)):
            raise UsageError(f"stdin must be bytes, got {type(stdin).__name__}")
        passed = [pass_fds[t] for t in targets] if pass_fds else []
        async with self._lock:
            self._check_open()
            self._stop_pending = False  # a stop() before this run began was not for it
            for _attempt in range(2):
                try:
                    cell = await self._cell()
                except (SandboxStartError, ZygoteDied, OSError) as e:
                    return self._infra(f"no sandbox could be started: {e}")
                if self._stop_pending:  # stopped while it waited for its cell: not run
                    self._stop_pending = False
                    for fd in passed:
                        close_quietly(fd)
                    return ExecResult(status=ExecStatus.SIGNAL, message="stopped by the "
                                      "caller (before the program started)",
                                      runtime=self.pool.runtime.id, tier=self.tier)
                run = Run(self, cell, spec, bytes(stdin), limits, passed, last)
                self._current = run
                try:
                    result = await run.run()
                finally:
                    self._current = None
                    self._restore_roots()  # for the next run; off its start's path
                if result.status is ExecStatus.INFRA or not cell.alive or run.held_open:
                    self._drop_cell()  # the next run gets a fresh cell; files are kept
                else:
                    cell.rest_files()  # a dense pool: 2 descriptors between runs
                # A cell that broke before the program's first instruction ran nothing of
                # the candidate's: run it once more on a fresh cell (unless fds were
                # passed: they went with the broken cell).
                if not (result.status is ExecStatus.INFRA and not run.started) or targets:
                    break
            for fd in passed:  # ours to close once handed over (or on any failure)
                close_quietly(fd)
            return result

    def _restore_roots(self) -> None:
        """Give the session's three roots (workspace, /tmp, /dev/shm) back their mode
        after each run: the candidate owns them and may have made them unusable (chmod
        000) for the next. They are mount points inside the cell, so it cannot remove
        or replace them; below them, whatever it did is its own (start_program)."""
        for path in self.mount_sources:
            try:
                os.chmod(path, 0o700)  # root-owned parent: never a link
            except OSError:
                pass  # the run reports what is wrong, if anything is

    @traced_acquire  # span sandbox.acquire when tracing is on (telemetry)
    async def _cell(self) -> Cell:
        """The session's cell: taken from the pool at the first run, with clones of the
        workspace's trees (open_tree) that the first run's `go` carries to the cell's
        init, which attaches them before it starts the program (one message, one wakeup
        of the init, instead of an `open` and a `go`).

        A warm cell can die unnoticed (its zygote was killed): then try another.
        """
        if self.cell is not None and self.cell.alive:
            return self.cell
        self._drop_cell()
        for attempt in range(3):
            cell = await self.pool.acquire(self.limits.network,
                                           fresh=bool(self.limits.net_allow))
            trees: list[int] = []
            try:
                for path in self.mount_sources:
                    trees.append(mounts.open_tree_clone(path))
            except OSError:
                for fd in trees:
                    os.close(fd)
                self.pool.done_with(cell)
                if attempt == 2:
                    raise
                continue
            except BaseException:
                for fd in trees:
                    os.close(fd)
                self.pool.done_with(cell)
                raise
            cell.trees = trees
            self.cell = cell
            if self.limits.net_allow:
                try:
                    await self._attach_gate(cell)
                except BaseException:
                    self._drop_cell()
                    raise
            return cell
        raise AssertionError("unreachable")

    def _drop_cell(self) -> None:
        if self.cell is not None:
            self._hand_back(recycle=False)

    def _hand_back(self, recycle: bool) -> None:
        """Give the cell back to the pool; a cell that had a network gate is destroyed
        (its namespace holds the veth), never recycled."""
        assert self.cell is not None
        if self.gate is not None:
            self._refused += self.gate.close()
            self.gate = None
            recycle = False
        self.pool.done_with(self.cell, recycle=recycle)
        self.cell = None

    async def network_refused(self) -> int:
        """Connection attempts (and other packets) to addresses and ports outside
        `Limits.net_allow` refused so far in this session, counted outside the candidate
        (network.py); 0 without an allow-list (its network namespace has no route out)."""
        if self.gate is None:
            return self._refused
        return self._refused + await asyncio.to_thread(self.gate.refused)

    async def _attach_gate(self, cell: Cell) -> None:
        fd = await self.pool.cell_netns(cell)
        try:
            self.gate = await asyncio.to_thread(Gate.open, self.limits.net_allow, fd,
                                                self.pool.config.net_egress)
        finally:
            os.close(fd)
        self.gate.serve(asyncio.get_running_loop())

    def _infra(self, message: str) -> ExecResult:
        return ExecResult(status=ExecStatus.INFRA, message=message,
                          runtime=self.pool.runtime.id, tier=self.tier)

    def _spec(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str,
              limits: Limits) -> dict[str, object]:
        run_env = run_environment(argv, env, self.pool.env)
        self._check_cwd(cwd)
        mode, path = self._resolve(list(argv), run_env["PATH"], cwd)
        # The CPU limit is enforced on the cgroup's total by `Run._check_cpu` (supervisor.py); the
        # per-process RLIMIT_CPU is only a backstop set well above it (the kernel's
        # per-process clock runs ahead of cgroup accounting under load here, and a
        # SIGXCPU must mean the limit was really reached).
        cpu = math.ceil(limits.cpu_s * 2) + 5
        return {
            "mode": mode, "argv": list(argv), "path": path, "env": run_env, "cwd": cwd,
            "uid": self.uid,
            "rlimits": {"RLIMIT_NOFILE": [limits.open_files, limits.open_files],
                        "RLIMIT_CPU": [cpu, cpu + 1],
                        "RLIMIT_CORE": [0, 0],
                        "RLIMIT_FSIZE": [limits.disk_bytes, limits.disk_bytes]},
        }

    def _check_cwd(self, cwd: str) -> None:
        """cwd must be an existing directory of the session (links are not followed)."""
        if not isinstance(cwd, str) or "\x00" in cwd:
            raise UsageError(f"cwd must be a string, got {cwd!r}")
        parts = [p for p in cwd.split("/") if p not in ("", ".")]
        if ".." in parts or not parts or parts[0] not in ("workspace", "tmp"):
            raise UsageError(f"cwd must be /workspace, a directory under it, or /tmp "
                             f"(no '..'); got {cwd!r}")
        host = "work" if parts[0] == "workspace" else "tmp"
        try:
            fd = mounts._open_dir_chain(os.path.join(self.dir, host), parts[1:], False, 0)
        except (FileNotFoundError, NotADirectoryError, UsageError) as e:
            raise UsageError(f"cwd {cwd!r} is not a directory in the session (create it "
                             "first, e.g. with mkdir in an earlier run)") from e
        os.close(fd)

    def _resolve(self, argv: list[str], path_var: str, cwd: str) -> tuple[str, str]:
        """("python", interpreter) for Python scripts (run warm), else ("exec", path).

        Raises UsageError when the command cannot exist in the sandbox view.
        """
        prog = argv[0]
        if prog in self.pool.python_names and len(argv) >= 2 and (
                argv[1] == "-c" and len(argv) >= 3 or not argv[1].startswith("-")):
            return "python", self.pool.runtime.python
        if "/" in prog:
            if prog.startswith("/"):
                if prog.startswith("/workspace/") or prog.startswith("/tmp/"):
                    return "exec", prog
                if not os.path.exists(prog) or not prog.startswith("/usr/"):
                    if not any(prog.startswith(p) for p in ("/bin/", "/sbin/", "/lib")):
                        raise UsageError(f"command {prog!r} does not exist in the sandbox "
                                         "runtime (only /usr and the workspace are visible)")
                    if not os.path.exists(prog):
                        raise UsageError(f"command {prog!r} does not exist in the sandbox "
                                         "runtime")
            return "exec", prog
        for d in path_var.split(":"):
            if d.startswith("/usr/") or d in ("/bin", "/sbin"):
                cand = os.path.join(d, prog)
                if os.path.isfile(cand) and os.access(cand, os.X_OK):
                    return "exec", cand
        raise UsageError(f"command {prog!r} not found on the sandbox PATH ({path_var}); "
                         "give an absolute path or install it in the runtime")


def _check_pass_fds(pass_fds: Mapping[int, int] | None) -> list[int]:
    """Validate {target fd in the program: our fd}; return the targets in order."""
    if not pass_fds:
        return []
    if not isinstance(pass_fds, Mapping):
        raise UsageError("pass_fds must map the fd number the program sees to an open fd "
                         "of ours, e.g. {3: sock.fileno()}")
    targets = sorted(pass_fds)
    for t in targets:
        src = pass_fds[t]
        if isinstance(t, bool) or not isinstance(t, int) or not 3 <= t <= 63:
            raise UsageError(f"pass_fds target {t!r} must be an int from 3 to 63 (0-2 are "
                             "stdin/stdout/stderr)")
        if isinstance(src, bool) or not isinstance(src, int):
            raise UsageError(f"pass_fds[{t}] must be an open fd number, got {src!r}")
        try:
            os.fstat(src)
        except OSError as e:
            raise UsageError(f"pass_fds[{t}] = {src} is not an open fd") from e
    return targets


SPEC_MAX = 100_000
"""Bytes a run's argv and environment may take together: they travel to the cell in one
datagram, which the kernel refuses past ~200 KB (an `infra` failure before this check)."""


def _check_spec_size(spec: dict[str, object]) -> None:
    argv = cast(list[str], spec["argv"])
    env = cast(dict[str, str], spec["env"])
    chars = sum(map(len, argv)) + sum(len(k) + len(v) + 2 for k, v in env.items())
    if chars * 4 < SPEC_MAX:  # most runs: no need to count bytes
        return
    size = sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in argv) + sum(
        len(f"{k}={v}".encode("utf-8", "surrogatepass")) + 1 for k, v in env.items())
    if size > SPEC_MAX:
        raise UsageError(f"argv and env take {size:,} bytes; a run's may take at most "
                         f"{SPEC_MAX:,}: write the program or its data to a file "
                         "(write_file) and pass its path")
