"""The warm pool: one zygote per pool and a set of cells prepared before they are needed.

A *cell* is one session's sandbox (see `zygote.py`): fresh namespaces, its own cgroup,
the read-only root already built, the first candidate process forked and waiting. The
pool keeps `PoolConfig.warm` cells ready, grows towards the recent peak of sessions in
use (up to `max_warm`) and shrinks back when demand falls; it refills from a low-water
mark (half the target) and drops surplus cells only once they have sat unused, so
sessions that take a cell and hand it back (recycled) do not make the pool create and
destroy cells (a judge did, every ~2 attempts, before). A cell serves one session
(every process of each run is killed before the run's result is reported) and is
destroyed when the session closes: nothing reaches the next session.

Everything the pool creates on the host lives under names that carry the owner's pid and
start time (`/run/trialbox/<pid>-<start>/…`, `<cgroup>/trialbox/<pid>-<start>/…`), so a
new pool can tell what a dead one left behind and reap it: processes, cgroups, mounts
(reaper.py). The zygote and the cells it prepares are spoken to through
zygote_client.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trialbox.errors import (SandboxStartError, SandboxUnavailable, Unavailable, UsageError,
                             ZygoteDied)
from trialbox.sandbox import mounts, uids
from trialbox.sandbox.capacity import (MEMORY_CHECK_AFTER, Admission, derive_capacity,
                                       raise_fd_limit)
from trialbox.sandbox.cgroups import CellFiles, CgroupDriver
from trialbox.sandbox.procview import ProcView
from trialbox.sandbox.reaper import owner_id, reap_orphans
from trialbox.sandbox.zygote_client import (BASE_ENV, Cell, FdReader, SocketReader, Zygote,
                                            build_dev_dir, build_root_template,
                                            cell_config, system_runtime)
from trialbox.telemetry import traced_cell_start, traced_warm
from trialbox.types import Limits, Runtime

if TYPE_CHECKING:
    from trialbox.sandbox.image_verify import ImageGuard
    from trialbox.sandbox.namespace import NamespaceSandbox
    from trialbox.sandbox.snapshot import Snapshot

__all__ = ["BASE_ENV", "Cell", "CellPool", "FdReader", "PoolConfig", "reap_orphans"]

log = logging.getLogger("trialbox.sandbox.pool")


@dataclass(frozen=True)
class PoolConfig:
    """How many cells to keep warm and where the pool keeps its state on the host."""

    warm: int = 4
    """Cells kept ready when idle."""
    max_warm: int = 32
    """Upper bound on ready cells when demand is high."""
    max_warming: int = 4
    """Cells being prepared at the same time (each costs ~3 ms of CPU)."""
    shrink_after_s: float = 10.0
    """How long a peak in demand keeps the pool large before it shrinks back, and how
    long a ready cell above the target sits unused before it is discarded."""
    state_dir: str = "/run/trialbox"
    """Host directory for session tmpfs mounts and the read-only root template."""
    python: str = "/usr/bin/python3"
    """The runtime's interpreter: runs the zygote, so sandboxed Python starts warm."""
    uid_count: int = 65_536
    """How many host uids the pool leases for its sessions (whole blocks of 65,536 from
    the node's grid, uids.py: no other pool on the node, in any process, has them);
    each open session holds one."""
    uid_lease_dir: str = uids.LEASE_DIR
    """Where the node's uid leases are kept (uids.py). Node-wide: every pool on a node
    must use the same, so leave the default outside tests."""
    max_cell_sessions: int = 1000
    """Sessions one cell may serve (reset between them) before it is replaced."""
    preload: tuple[str, ...] = ("traceback", "linecache", "collections", "functools",
                                "itertools", "math", "re", "typing", "heapq", "bisect",
                                "string", "dataclasses", "fractions", "decimal", "base64")
    """Stdlib modules the zygote imports once so sandboxed programs find them loaded."""
    preload_sources: tuple[tuple[str, str], ...] = ()
    """(module name, source) of standalone helper modules made importable in every
    sandbox of this pool at no cost, e.g. the judge's codec. Never anything secret."""
    default_limits: Limits = field(default_factory=Limits)
    """Limits cells are prepared with; a run with other limits rewrites them at start."""
    native: str = "auto"
    """The cells' hot path (the init's loop, the candidate's set-up) in C (cell.c,
    built with gcc at start): "auto" uses it when it builds and falls back to the same
    steps in Python with a warning, "on" requires it, "off" never builds it. Same
    isolation either way; C spares each run ~0.5 k copy-on-write faults (docs/sandbox.md)."""
    net_egress: str = ""
    """The network namespace (a path, e.g. /run/netns/mirror) that connections allowed
    by `Limits.net_allow` are made from; empty: the supervisor's own (network.py)."""
    capacity: int | None = None
    """Open sessions this pool allows at once; None derives it at start from the host
    (descriptors, memory, pids, namespaces: `derive_capacity`). Openers past it wait."""
    capacity_wait_s: float = 600.0
    """How long an open past capacity waits for a session to close before it fails
    with `Unavailable` (a clear error, not an `infra` result)."""
    session_memory_mb: float = 1.5
    """Host memory one open session with its cell is assumed to take when capacity is
    derived (`trialbox bench density` measures it: ~1.4 MiB here)."""
    dense_after: int = 256
    """Live cells past which a cell between runs closes its cgroup files (9 descriptors
    on cgroup v1) and reopens them at its next run (~0.1 ms): an idle session then
    holds 1 descriptor (its cell's session socket)."""
    max_starting: int = 16
    """Cells being started at once (warm-ups and on-demand alike); more wait their turn
    rather than pile up on the zygote past the cells' 30 s start deadline (64 at once
    passed it at a load average of 50-90 on 2 cores: `trialbox bench density`)."""
    image: str = ""
    """A built image's directory (`trialbox image build`): the cells' read-only /usr and
    the zygote's interpreter come from it, every result records its content hash, and it
    is verified in full at start and cheaply before each session (docs/images.md).
    Empty: the host's /usr and /usr/bin/python3."""
    image_verify_s: float = 0.0
    """With `image`: seconds between periodic full re-hashes (0: only at start and on
    demand, `pool.image_guard.full()`)."""

    def __post_init__(self) -> None:
        if self.native not in ("auto", "on", "off"):
            raise UsageError(f"PoolConfig: native must be 'auto', 'on' or 'off', got "
                             f"{self.native!r}")
        if not 0 <= self.warm <= self.max_warm:
            raise UsageError(f"PoolConfig: need 0 <= warm ({self.warm}) <= max_warm "
                             f"({self.max_warm})")
        if self.max_warming < 1:
            raise UsageError("PoolConfig.max_warming must be at least 1")
        if self.capacity is not None and self.capacity < 1:
            raise UsageError(f"PoolConfig.capacity must be at least 1 (or None to derive "
                             f"it from the host), got {self.capacity}")
        if self.capacity_wait_s < 0 or self.session_memory_mb <= 0:
            raise UsageError("PoolConfig: capacity_wait_s must be >= 0 and "
                             "session_memory_mb > 0")
        if self.max_starting < 1 or self.dense_after < 0:
            raise UsageError("PoolConfig: max_starting must be >= 1 and dense_after >= 0")
        if self.uid_count < 1:
            raise UsageError("PoolConfig.uid_count must be at least 1")


class CellPool:
    """A zygote and its warm cells; bound to the event loop it was started on. The
    namespace tier's `SandboxProvider` (base.py): `await pool.open(limits)` is a session."""

    tier = "namespace"

    def __init__(self, config: PoolConfig | None = None):
        self.config = config or PoolConfig()
        self.preloaded_modules = frozenset(n for n, _src in self.config.preload_sources)
        """base.preloaded_modules: the sources the zygote imports into every session."""
        self.id = owner_id()
        self.dir = os.path.join(self.config.state_dir, self.id)
        self.root = os.path.join(self.dir, "root")
        self.sessions_dir = os.path.join(self.dir, "s")
        self.dev = os.path.join(self.dir, "dev")
        self.empty = os.path.join(self.dir, "empty")
        self.views = os.path.join(self.dir, "proc")
        """A tmpfs of the cells' /proc view files (procview.py), a directory each."""
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.cgroups: CgroupDriver = None  # type: ignore[assignment]
        self.runtime: Runtime = None  # type: ignore[assignment]
        self.env: dict[str, str] = dict(BASE_ENV)
        """What every run's environment starts from: BASE_ENV and an image's [env]."""
        self.python_names: frozenset[str] = frozenset()
        self.recycles = False  # may a cleanly closed session's cell serve another (start)
        self.zygote = Zygote(self.dir, self.config.python)
        """The pool's zygote process (zygote_client.py); a new one when it dies."""
        self._ready: deque[Cell] = deque()
        self._warming = 0
        self._refilling = True  # between the low-water mark and the target (_refill)
        self._seq = 0
        self._in_use = 0
        self._peak_value, self._peak_at = 0, 0.0
        self._live: dict[str, Cell] = {}
        self._failures = 0
        self.uids: uids.UidLease | None = None
        """The host uids this pool's sessions run as, leased for the pool's life."""
        self._uids_in_use: set[int] = set()
        self._uid_next = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._janitor = ThreadPoolExecutor(1, thread_name_prefix="trialbox-cgroups")
        self._free_dirs: list[str] = []  # session directories to reuse (take_session_dir)
        self._dirs = ThreadPoolExecutor(1, thread_name_prefix="trialbox-umount")
        self._dir_seq = 0
        self.closed = False
        self.started = False
        self.native_path: str | None = None
        self.native = False
        """Whether the cells run cell.c's hot path (see PoolConfig.native)."""
        self.zygote_restarts = 0
        self.reaped: dict[str, int] = {}
        self.admission: Admission | None = None
        """Open sessions against the node's capacity (set at start; capacity.py)."""
        self._starting = asyncio.Semaphore(self.config.max_starting)
        self.memory_check_after = MEMORY_CHECK_AFTER
        """Live cells past which a new cell first checks MemAvailable (acquire)."""
        self.cell_memory_waits = 0
        """Cell takers that waited for memory (a cell to come back) before starting."""
        self.image_guard: ImageGuard | None = None
        """Verifies `PoolConfig.image` (image_verify.py); None without an image."""

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> CellPool:
        self.loop = asyncio.get_running_loop()
        try:
            self._start_sync()
        except BaseException:
            if self.uids is not None:  # a pool that never started holds no uids
                self.uids.close()
            raise
        if self.image_guard is not None:
            self.image_guard.start_periodic()
        self._refill()
        return self

    def _start_sync(self) -> None:
        if os.geteuid() != 0:
            raise SandboxUnavailable(
                "the namespace tier needs root (it creates namespaces, cgroups and mounts "
                "for each sandbox); run as root, e.g. `sudo make test`")
        if sys.platform != "linux":
            raise SandboxUnavailable("the namespace tier needs Linux")
        self.cgroups = CgroupDriver.detect()
        if self.config.image:
            self._start_image()
        else:
            self.runtime = system_runtime(self.config.python)
        self.python_names = frozenset({"python", "python3", self.runtime.python,
                                       os.path.realpath(self.runtime.python)})
        raise_fd_limit()  # before the capacity, which the descriptor limit bounds
        self.admission = Admission(
            derive_capacity(self.config.capacity, self.config.session_memory_mb,
                            self.config.uid_count, self.config.dense_after),
            self.config.capacity_wait_s)
        # A recycled cell restarts its pids at 2 through ns_last_pid, so the next session
        # cannot count what earlier ones forked. Kernels built without checkpoint/restore
        # (user-mode-linux's, some minimal ones) lack the file: cells then serve one
        # session each rather than leak that count.
        self.recycles = os.path.exists("/proc/sys/kernel/ns_last_pid")
        self.reaped = reap_orphans(self.config.state_dir, self.cgroups)
        if any(self.reaped.values()):
            log.warning("reaped what dead pools left behind: %s", self.reaped)
        self.uids = uids.lease(self.config.uid_count, self.config.uid_lease_dir)
        os.makedirs(self.sessions_dir, exist_ok=True)
        os.chmod(self.dir, 0o700)
        # The cells' root is a bind of this directory; on a filesystem of its own, the
        # bind's source reads "/" in a candidate's /proc/self/mountinfo, not a host
        # path naming the pool.
        os.makedirs(self.root, exist_ok=True)
        mounts.mount_tmpfs(self.root, 4 << 20, uid=0, mode=0o755)
        if self.image_guard is not None:
            from trialbox.sandbox.image_root import prepare_template
            prepare_template(self.image_guard.image, self.root)
        build_root_template(self.root, self.image_guard.image.rootfs
                             if self.image_guard is not None else "/")
        # What each cell's overlays stand on (zygote.overlay): its /dev's nodes, and the
        # empty second layer overlayfs wants.
        os.makedirs(self.empty, mode=0o755, exist_ok=True)
        # Each cell's /proc/meminfo, ... (procview.py), on a filesystem of its own (a
        # cell's mountinfo shows /<its dir>/meminfo), mounted before the zygote starts
        # so that its cells see it.
        os.makedirs(self.views, exist_ok=True)
        mounts.mount_tmpfs(self.views, 256 << 20, uid=0, mode=0o755)
        build_dev_dir(self.dev)
        self.native_path = self._build_native()
        self._spawn_zygote()
        self.started = True

    def _start_image(self) -> None:
        """Load `PoolConfig.image` and verify it in full before any cell exists."""
        from trialbox.sandbox.image import load_image
        from trialbox.sandbox.image_root import image_runtime
        from trialbox.sandbox.image_verify import ImageGuard
        image = load_image(self.config.image)
        self.image_guard = ImageGuard(image, self.config.image_verify_s)
        self.image_guard.start()  # watch, then hash: ImageMismatch, the pool does not start
        self.runtime = image_runtime(image)
        self.env = {**BASE_ENV, **dict(image.env)}  # as the zygote's config has it

    def _build_native(self) -> str | None:
        """cell.c built and copied into this pool's root-only state dir, or None (the
        zygote then runs the same steps in Python)."""
        if self.config.native == "off":
            return None
        from trialbox.sandbox.native import NativeUnavailable, build
        try:
            built = build(self.config.state_dir)
            path = os.path.join(self.dir, "cell.so")
            shutil.copyfile(built, path)
            return path
        except (NativeUnavailable, OSError) as e:
            if self.config.native == "on":
                raise SandboxUnavailable(f"the cells' C hot path cannot be built: {e} "
                                         "(or use PoolConfig(native='auto'))") from e
            log.warning("cells run their hot path in Python (slower): %s", e)
            return None

    def _spawn_zygote(self) -> None:
        image = self.image_guard.image if self.image_guard is not None else None
        image_preexec = None
        if image is not None:
            from trialbox.sandbox.image_root import zygote_preexec
            image_preexec = zygote_preexec(image)
        python = image.python() if image is not None else self.config.python
        # The zygote runs from an overlay of /usr (its executable, and so every Python
        # candidate's /proc/self/exe, must not be the host's file: each cell swaps in
        # its own copy). Only where the interpreter lives under /usr.
        own_usr = os.path.realpath(python).startswith("/usr/")
        empty = self.empty

        def preexec() -> None:
            if image_preexec is not None:
                image_preexec()  # a private mount namespace with the image's /usr
                mounts.overlay_ro("/usr", "/usr", empty)
            else:
                mounts.private_usr_overlay(empty)

        self.native = self.zygote.spawn(
            cell_config(self.root, image, self.config.preload, self.config.preload_sources,
                        self.native_path, self.dev, self.empty, own_usr),
            preexec if own_usr else image_preexec)
        if own_usr and not self.zygote.own_exe:
            log.warning("cells share the zygote's executable (/proc/self/exe): the kernel "
                        "refused to swap it: %s", self.zygote_log_tail())
        if self.native_path is not None and not self.native:
            why = f"the zygote could not load {self.native_path}: {self.zygote_log_tail()}"
            if self.config.native == "on":
                raise SandboxUnavailable(why)
            log.warning("cells run their hot path in Python (slower): %s", why)

    def zygote_log_tail(self) -> str:
        return self.zygote.log_tail()

    def send_zygote(self, msg: dict[str, object], fds: list[int] | None = None) -> None:
        if self.closed:
            raise ZygoteDied("the pool is closed")
        self.zygote.send(msg, fds)

    async def open(self, limits: Limits | None = None, *,
                   from_snapshot: Snapshot | None = None) -> NamespaceSandbox:
        """A new session in this pool (`SandboxProvider.open`); with `from_snapshot`, a
        fork of it (its files, copy-on-write; `limits` default to the snapshot's)."""
        from trialbox.sandbox.namespace import NamespaceSandbox  # it imports this module
        if from_snapshot is not None:
            return await from_snapshot.open(limits, pool=self)
        return await NamespaceSandbox.open(self, limits)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.close_sync()

    def close_sync(self) -> None:
        """Tear everything down: cells, zygote, cgroups, session mounts, state dir."""
        if self.closed:
            return
        self.closed = True
        for cell in list(self._live.values()):  # readers off each socket before it closes
            if cell.status is not None and self.loop is not None and not self.loop.is_closed():
                try:
                    cell.status.close()
                except Exception:  # the loop may already be gone
                    pass
        if self.image_guard is not None:
            self.image_guard.close()
        while self._ready:
            cell = self._ready.popleft()
            if cell.go is not None:
                cell.go.close()
        self.zygote.close()
        for cell in list(self._live.values()):
            if cell.files is not None:
                cell.files.close()
                cell.files = None
            if cell.go is not None:
                cell.go.close()
                cell.go = None
            if cell.status is not None and self.loop is not None and not self.loop.is_closed():
                try:
                    cell.status.close()
                except Exception:  # the loop may already be gone
                    pass
        self._janitor.shutdown(wait=True)
        self._dirs.shutdown(wait=True)
        if self.cgroups is not None:
            top = f"trialbox/{self.id}"
            for _ in range(100):
                self.cgroups.kill_all(top)
                for d in self.cgroups.dirs(top):
                    if os.path.isdir(d):
                        for c in os.listdir(d):
                            if os.path.isdir(os.path.join(d, c)):
                                self.cgroups.kill_all(f"{top}/{c}")
                if self.cgroups.remove(top):
                    break
                time.sleep(0.02)
        for mp in mounts.mounts_under(self.dir):
            mounts.umount(mp)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.uids is not None:  # last: every process that ran as them is gone
            self.uids.close()

    # ---------------------------------------------------------------- uids
    def take_uid(self) -> int:
        """A host uid for a new session: the pool's lease, round robin, none in use."""
        assert self.uids is not None, "the pool is not started"
        for _ in range(self.config.uid_count):
            uid = self.uids.first + self._uid_next
            self._uid_next = (self._uid_next + 1) % self.config.uid_count
            if uid not in self._uids_in_use:
                self._uids_in_use.add(uid)
                return uid
        raise SandboxStartError("every sandbox uid of the pool is in use; raise "
                                "PoolConfig.uid_count")

    def give_uid(self, uid: int) -> None:
        self._uids_in_use.discard(uid)

    def take_session_dir(self) -> str:
        """An empty, unmounted directory for a new session's tmpfs: one a closed session
        gave back, or a new one. Directories are reused, never removed while the pool
        lives: rmdir of a mount point just unmounted waits for an RCU grace period while
        holding the parent directory's lock (every other session's mkdir waited on it)."""
        if self._free_dirs:
            return self._free_dirs.pop()
        self._dir_seq += 1
        path = os.path.join(self.sessions_dir, f"w{self._dir_seq}")
        os.mkdir(path, 0o700)
        return path

    def retire_session(self, path: str, uid: int) -> None:
        """Unmount a closed session's tmpfs, then make its directory and uid free again.
        Every umount that unmounts something waits for an expedited RCU grace period
        (~1-3 ms here, longer under load): a thread of its own does it, never the event
        loop, nor the cgroup janitor that new cells wait on."""
        def work() -> None:
            try:
                mounts.umount(path)
                freed: str | None = path
            except OSError:
                freed = None  # still mounted: not reused (the pool's close unmounts it)
            try:
                self.loop.call_soon_threadsafe(self._retired, freed, uid)
            except RuntimeError:  # the loop is closed: so is the pool
                pass
        try:
            self._dirs.submit(work)
        except RuntimeError:  # the pool is closed: unmount here
            try:
                mounts.umount(path)
            except OSError:
                pass
            self.give_uid(uid)

    def _retired(self, path: str | None, uid: int) -> None:
        if path is not None and not self.closed:
            self._free_dirs.append(path)
        self.give_uid(uid)

    # ---------------------------------------------------------------- cells
    def _ensure_zygote(self) -> None:
        """Start a new zygote if the last one died (its cells died with it: their
        sessions get `infra` once and a fresh cell on their next run)."""
        if self.zygote.running:
            return
        proc = self.zygote.proc
        log.warning("zygote exited (%s); starting a new one: %s",
                    proc.returncode if proc else None, self.zygote_log_tail())
        self.zygote.detach()
        self.zygote_restarts += 1
        while self._ready:
            self.release(self._ready.popleft())
        self._spawn_zygote()

    async def _make_cell(self, net: bool) -> Cell:
        async with self._starting:
            return await self._start_cell(net)

    @property
    def capacity(self) -> int:
        """Sessions this pool allows open at once (PoolConfig.capacity, or derived from
        the host at start); openers past it wait (capacity.py)."""
        if self.admission is None:
            raise UsageError("the pool is not started: `await pool.start()` first")
        return self.admission.capacity.sessions

    @traced_cell_start  # span sandbox.start, starts, start latency (telemetry)
    async def _start_cell(self, net: bool) -> Cell:
        if self.closed:
            raise ZygoteDied("the pool is closed")
        self._ensure_zygote()
        self._seq += 1
        cell = Cell(self, f"c{self._seq}", net, self.config.default_limits)
        self._live[cell.id] = cell  # live before its cgroup exists: never looks stray
        try:
            procs, cell.files, cell.view = await self.loop.run_in_executor(
                self._janitor, self._create_cgroup, cell.rel, cell.limits)
            cg_fds = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in procs]
        except BaseException:
            self.release(cell)
            raise
        # The session socket carries both ways: `go`s to the cell's init, and the status
        # records that the init and its candidates write (their "status pipe" is the
        # same socket's other end, passed twice): one descriptor per live cell here.
        go_parent, go_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cell.go = go_parent
        try:
            cell.status = SocketReader(self.loop, go_parent, 4096, cell._status_data)
            cell.status.done.add_done_callback(cell._status_eof)
            self.send_zygote({"op": "warm", "cell": cell.id, "net": net,
                              "proc": cell.view.dir if cell.view is not None else ""},
                             [go_child.fileno(), go_child.fileno(), *cg_fds])
        except BaseException:
            self.release(cell)
            raise
        finally:
            go_child.close()
            for fd in cg_fds:
                os.close(fd)
        try:
            await asyncio.wait_for(asyncio.shield(cell.ready), 30)
        except BaseException:
            cell.discard()
            raise
        return cell

    def _create_cgroup(self, rel: str,
                       limits: Limits) -> tuple[list[str], CellFiles, ProcView | None]:
        """A cell's cgroup, its files, and its /proc view files (a random name: it shows
        in the cell's mountinfo, and a sequence would count the pool's cells)."""
        procs = self.cgroups.create(rel, limits)
        files = self.cgroups.open_files(rel)
        try:
            return procs, files, ProcView(os.path.join(self.views, secrets.token_hex(8)),
                                          limits)
        except BaseException:
            files.close()
            raise

    async def acquire(self, net: bool = False, fresh: bool = False) -> Cell:
        """A ready cell (warm if one is waiting, prepared now otherwise). `fresh`: one
        that has served no session (a recycled cell's init may still be renewing its
        network namespace; a network gate must attach to the one its candidates get)."""
        if self.closed:
            raise ZygoteDied("the pool is closed")
        self._in_use += 1
        self._note_demand()
        if self.zygote.proc is not None and not self.zygote.running:
            while self._ready:  # cells of a dead zygote die with it
                self.release(self._ready.popleft())
        try:
            deadline = 0.0
            while True:
                if not net and not fresh:
                    while self._ready:
                        cell = self._ready.popleft()
                        if cell.status is not None and not cell.status.done.done():
                            self._refill()
                            return cell
                        self.release(cell)
                if not self._short_of_memory():
                    break
                # Past MEMORY_CHECK_AFTER live cells with MemAvailable under the floor:
                # wait for a cell to come back (a run ends, a session parks or closes)
                # instead of starting one more.
                now = time.monotonic()
                if not deadline:
                    deadline = now + self.config.capacity_wait_s
                    self.cell_memory_waits += 1
                elif now > deadline:
                    assert self.admission is not None
                    raise Unavailable(
                        f"no memory for another cell on this node after "
                        f"{self.config.capacity_wait_s:g} s: {len(self._live):,} cells "
                        f"live, MemAvailable below the floor of "
                        f"{self.admission.memory_floor >> 20:,} MiB; park or close "
                        "sessions between runs (fewer run at once), or raise "
                        "PoolConfig.capacity_wait_s")
                await asyncio.sleep(0.05)
            self._refill()
            return await self._make_cell(net)
        except BaseException:
            self._in_use -= 1
            raise

    def _short_of_memory(self) -> bool:
        """Too little memory for another cell: past MEMORY_CHECK_AFTER live cells, and
        MemAvailable under the admission's floor (capacity.py)."""
        return (len(self._live) >= self.memory_check_after and self.admission is not None
                and self.admission.memory_short())

    async def cell_netns(self, cell: Cell) -> int:
        """An fd of the cell's network namespace (its init's: the zygote knows its pid),
        for a network gate (network.py). The caller closes it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.settimeout(5)
            self.send_zygote({"op": "netns", "cell": cell.id}, [theirs.fileno()])
            theirs.close()
            msg, fds, _flags, _addr = await self.loop.run_in_executor(
                None, socket.recv_fds, ours, 16, 1)
        finally:
            ours.close()
            theirs.close()
        if msg != b"N" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandboxStartError(f"cell {cell.id}: its network namespace could not be "
                                    "opened (the cell is gone)")
        return fds[0]

    def done_with(self, cell: Cell, recycle: bool = False) -> None:
        """A session finished with this cell. With `recycle` (the session ended cleanly)
        a healthy cell is reset — no process, no workspace, new IPC and network
        namespaces — and goes back to the warm set: far cheaper than a new cell.
        Otherwise it is destroyed. Either way the pool is kept at its target."""
        self._in_use -= 1
        for fd in cell.trees:  # never attached: the reset has nothing of them to undo
            os.close(fd)
        cell.trees = []
        if (recycle and self.recycles and cell.alive and not cell.net and not self.closed
                and cell.uses < self.config.max_cell_sessions):
            try:
                cell.send(b"R")
            except (OSError, SandboxStartError):
                self.release(cell)
            else:
                cell.uses += 1
                cell.idle_since = time.monotonic()
                self._ready.appendleft(cell)  # next to be used; a shrink drops fresh ones
        else:
            self.release(cell)
        self._refill()

    def release(self, cell: Cell) -> None:
        if cell.status is not None and cell.status.fd >= 0:
            cell.status.close()  # before its socket closes (the same descriptor)
        if cell.go is not None:
            cell.go.close()  # the cell's init sees EOF, kills everything, exits
            cell.go = None
            cell.kill()
        if cell.files is not None:
            cell.files.close()
            cell.files = None
        if cell.view is not None:  # its init's bind keeps the files while it lives
            view, cell.view = cell.view, None
            if not self.closed:
                self._janitor.submit(shutil.rmtree, view.dir, True)
        if cell.id not in self._live:
            return  # released already
        self.forget(cell)
        if self.closed:
            return  # close_sync removes every cgroup of the pool
        # rmdir of a cgroup whose tasks just exited waits on the kernel (1-12 ms here):
        # never on the event loop.
        self._janitor.submit(self._remove_cgroup, cell.rel)

    def _remove_cgroup(self, rel: str) -> None:
        t0 = time.monotonic()
        for attempt in range(200):
            if self.cgroups.remove(rel):
                if time.monotonic() - t0 > 1:
                    log.warning("cgroup %s took %.1f s to remove", rel, time.monotonic() - t0)
                return
            self.cgroups.kill_all(rel)
            time.sleep(0.005 * min(attempt + 1, 20))
        log.warning("cgroup %s could not be removed; the next pool start reaps it", rel)

    def forget(self, cell: Cell) -> None:
        self._live.pop(cell.id, None)

    def _note_demand(self) -> None:
        """Remember the highest number of runs in flight over the last shrink window."""
        now = time.monotonic()
        if self._in_use >= self._peak_value or now - self._peak_at > self.config.shrink_after_s:
            self._peak_value, self._peak_at = self._in_use, now

    def target(self) -> int:
        """Ready cells wanted now: the configured floor, or the recent peak in flight."""
        self._note_demand()
        return min(self.config.max_warm, max(self.config.warm, self._peak_value))

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    async def settle(self, timeout: float = 2.0) -> None:
        """Wait until the pool is idle: its warm cells ready, none being prepared, the
        cgroup janitor and the unmounting thread done. For benchmarks, which must not
        time the refill of one measurement inside the next."""
        deadline = time.monotonic() + timeout
        # Top up now: between the low-water mark and the target the pool does not
        # refill by itself (_refill), and a settled pool is a full one.
        self._refilling = True
        self._refill()
        while ((len(self._ready) < self.config.warm or self._warming > 0)
               and time.monotonic() < deadline and not self.closed):
            await asyncio.sleep(0.0005)
        if self.closed:
            return
        for worker in (self._janitor, self._dirs):
            try:  # one thread, FIFO: a no-op queued now runs after everything before it
                await asyncio.wait_for(self.loop.run_in_executor(worker, lambda: None),
                                       max(0.01, deadline - time.monotonic()))
            except (TimeoutError, RuntimeError):
                pass

    def _refill(self) -> None:
        if self.closed:
            return
        target = self.target()
        # Ready cells above the target go only once they have sat unused for
        # shrink_after_s (the right end of the deque is the idlest: recycled cells are
        # taken first): cells handed back by sessions that come and go must not be
        # thrown away to be made again a moment later.
        now = time.monotonic()
        while len(self._ready) > target and (
                len(self._ready) > self.config.max_warm
                or now - self._ready[-1].idle_since >= self.config.shrink_after_s):
            self._ready.pop().discard()
        if self._failures >= 3:
            if self.zygote.proc is not None and not self.zygote.running:
                self._failures = 0  # the zygote died: the next warm restarts it
            else:
                return
        # Refill in bursts, from a low-water mark back up to the target, so a cell
        # taken and handed back (recycled) a moment later does not start a warm-up
        # each time. With both rules, a judge's steady take-and-return stops making
        # and destroying a cell every ~2 attempts.
        if self._short_of_memory():
            return  # no warm-up into the host's last memory; takers wait (acquire)
        stock = len(self._ready) + self._warming
        if stock < max(1, target // 2):
            self._refilling = True
        elif stock >= target:
            self._refilling = False
        while (self._refilling and len(self._ready) + self._warming < target
               and self._warming < self.config.max_warming):
            self._warming += 1
            task = self.loop.create_task(self._warm_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @traced_warm  # background warm-ups are traces of their own (telemetry)
    async def _warm_one(self) -> None:
        try:
            cell = await self._make_cell(False)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._failures += 1
            log.warning("could not warm a cell (%d in a row): %s", self._failures, e)
            return
        finally:
            self._warming -= 1
        self._failures = 0
        if self.closed:
            cell.discard()
            return
        cell.idle_since = time.monotonic()
        self._ready.append(cell)
        self._refill()
