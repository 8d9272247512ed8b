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
new pool can tell what a dead one left behind and reap it: processes, cgroups, mounts.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trialbox.errors import SandboxStartError, SandboxUnavailable, UsageError, ZygoteDied
from trialbox.sandbox import mounts
from trialbox.sandbox.capacity import Admission, derive_capacity, raise_fd_limit
from trialbox.sandbox.cgroups import CellFiles, CgroupDriver
from trialbox.sandbox.seccomp import build_filter
from trialbox.telemetry import traced_cell_start, traced_warm
from trialbox.types import Limits, Runtime

if TYPE_CHECKING:
    from trialbox.sandbox.image_verify import ImageGuard
    from trialbox.sandbox.namespace import NamespaceSandbox
    from trialbox.sandbox.snapshot import Snapshot

log = logging.getLogger("trialbox.sandbox.pool")

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
MOUNT_TARGETS = ["/workspace", "/tmp", "/dev/shm"]
"""Where a session's work/, tmp/ and shm/ appear inside its cell."""
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
BASE_ENV = {"PATH": SANDBOX_PATH, "HOME": "/workspace", "LANG": "C.UTF-8",
            "TMPDIR": "/tmp", "USER": "sandbox", "LOGNAME": "sandbox",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
"""A run's environment unless it adds its own; the zygote holds it already (a run
that asks for exactly this environment does not rebuild it)."""


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
    uid_base: int = 1_000_000
    """First host uid handed to sessions (unprivileged, owns nothing on the host)."""
    uid_count: int = 65_536
    """How many uids the pool cycles through; each open session holds one."""
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
        if self.uid_base < 65_536 or self.uid_count < 1:
            raise UsageError("PoolConfig.uid_base must be >= 65536 (above every real "
                             "user) and uid_count >= 1")


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


def _owner_alive(name: str) -> bool:
    parts = name.split("-")
    if len(parts) < 2 or not parts[0].isdigit():
        return True  # not ours: leave it alone
    return _proc_start(int(parts[0])) == parts[1]


def reap_orphans(state_dir: str, driver: CgroupDriver) -> dict[str, int]:
    """Remove what dead pools left: processes in their cgroups, the cgroups, mounts."""
    counts = {"processes": 0, "cgroups": 0, "mounts": 0}
    if os.path.isdir(state_dir):
        for name in os.listdir(state_dir):
            if _owner_alive(name):
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
            if not os.path.isdir(os.path.join(top, name)) or _owner_alive(name):
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


def system_runtime(python: str = "/usr/bin/python3") -> Runtime:
    real = os.path.realpath(python)
    if not os.path.isfile(real):
        raise SandboxUnavailable(f"runtime interpreter {python} not found; install python3 "
                                 "(apt-get install python3) or declare another runtime")
    h = hashlib.sha256()
    with open(real, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    out = subprocess.run([real, "-I", "-S", "-c",
                          "import sys;print('%d.%d.%d'%sys.version_info[:3])"],
                         capture_output=True, text=True, env={}, timeout=30)
    version = out.stdout.strip()
    major_minor = ".".join(version.split(".")[:2])
    return Runtime(name=f"python{major_minor}-system", python=python, version=version,
                   digest=h.hexdigest())


# ------------------------------------------------------------------ fd readers

class FdReader:
    """Reads a pipe on the event loop; keeps the first `cap` bytes and counts the rest."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, cap: int,
                 on_data: Callable[[FdReader], None] | None = None):
        self.loop, self.fd, self.cap, self.on_data = loop, fd, cap, on_data
        self.buf = bytearray()
        self.total = 0
        self.done: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _recv(self) -> bytes:
        return os.read(self.fd, 1 << 16)

    def _read(self) -> None:
        try:
            data = self._recv()
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self.total += len(data)
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += data[:room]
        if self.on_data is not None:
            self.on_data(self)

    def drain(self, limit: int = 4 << 20) -> None:
        """Read what the pipe holds now, without waiting for more (at most `limit`)."""
        while self.fd >= 0 and limit > 0:
            before = self.total
            self._read()
            if self.total == before:  # nothing there (EAGAIN), or EOF closed it
                return
            limit -= self.total - before

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            self._close_fd()
            self.fd = -1
        if not self.done.done():
            self.done.set_result(None)

    def _close_fd(self) -> None:
        os.close(self.fd)


class SocketReader(FdReader):
    """Reads a cell's status records from its session socket, the descriptor the
    supervisor also sends its `go`s on (one descriptor per cell, not a socket and a
    pipe: at 10,000 live sessions the difference is 10,000 descriptors). Reads never
    block (MSG_DONTWAIT) while sends stay blocking; closing stops the reading, and the
    socket's owner (the cell) closes the socket itself."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, cap: int,
                 on_data: Callable[[FdReader], None] | None = None):
        self.sock = sock
        self.loop, self.fd, self.cap, self.on_data = loop, sock.fileno(), cap, on_data
        self.buf = bytearray()
        self.total = 0
        self.done = loop.create_future()
        loop.add_reader(self.fd, self._read)

    def _recv(self) -> bytes:
        return self.sock.recv(1 << 16, socket.MSG_DONTWAIT)

    def _close_fd(self) -> None:
        pass  # the cell closes its socket


# ------------------------------------------------------------------ cells

_RLIMIT_NUMBERS = {"RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_CORE": 4,
                   "RLIMIT_NOFILE": 7}
_NO_LIMIT = (1 << 64) - 1


def encode_spec(spec: dict[str, Any]) -> bytes:
    """A run's spec as the candidate reads it — in C (cell.c `enter`) or in Python
    (zygote.decode_spec): no JSON, whose parser in a freshly forked process costs
    ~80 copy-on-write faults. Little-endian: u32 uid; u8 n, n x (u8 resource, u64
    soft, u64 hard; all ones = unlimited); u8 m, m x u8 fd target; u16 length + cwd;
    then the program, NUL-separated: mode, path, argc, argv..., and `=` for the pool's
    own environment (BASE_ENV, which the candidate inherits) or its KEY=VALUE items."""
    rlimits = spec["rlimits"]
    out = [struct.pack("<IB", spec["uid"], len(rlimits))]
    for name, (soft, hard) in rlimits.items():
        out.append(struct.pack("<BQQ", _RLIMIT_NUMBERS[name],
                               _NO_LIMIT if soft < 0 else soft,
                               _NO_LIMIT if hard < 0 else hard))
    targets = spec.get("fds", [])
    out.append(struct.pack("<B", len(targets)) + bytes(targets))
    cwd = spec["cwd"].encode("utf-8", "surrogateescape")
    out.append(struct.pack("<H", len(cwd)) + cwd)
    argv = spec["argv"]
    env = spec["env"]
    program = [spec["mode"], spec["path"] or "", str(len(argv)), *argv]
    program += ["="] if env == BASE_ENV else [f"{k}={v}" for k, v in env.items()]
    out.append(b"\0".join(x.encode("utf-8", "surrogatepass") for x in program))
    return b"".join(out)


class Cell:
    """One session's prepared sandbox (see zygote.py): used by one session, then gone."""

    def __init__(self, pool: CellPool, cid: str, net: bool, limits: Limits):
        self.pool, self.id, self.net, self.limits = pool, cid, net, limits
        self.rel = f"trialbox/{pool.id}/{cid}"
        self.files: CellFiles | None = None
        self.uses = 0
        self.go: socket.socket | None = None
        self.status: FdReader | None = None
        self.ready: asyncio.Future[None] = pool.loop.create_future()
        # A cell that dies while nobody awaits it is normal (pool shutdown, discard).
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.on_status: Callable[[Cell], None] | None = None
        self.error = ""
        self.idle_since = 0.0  # when it last went into the ready set (pool trimming)
        self.trees: list[int] = []
        """Clones of a session's workspace trees, for the init to attach on the next
        `go` (namespace.py); sent with it, or closed when the cell is handed back."""

    def _status_data(self, reader: FdReader) -> None:
        if not self.ready.done():
            buf = bytes(reader.buf)
            if buf.startswith(b"R"):
                self.ready.set_result(None)
            elif buf:
                self.error = buf[3:].decode(errors="replace") if buf.startswith(b"E") \
                    else f"unexpected status bytes {buf[:16]!r}"
                self.ready.set_exception(SandboxStartError(f"cell {self.id}: {self.error}"))
        if self.on_status is not None:
            self.on_status(self)

    def _status_eof(self, _f: asyncio.Future[None]) -> None:
        if not self.ready.done():
            self.ready.set_exception(SandboxStartError(
                f"cell {self.id} died while being prepared: "
                f"{self.error or self.pool.zygote_log_tail()}"))
        if self.on_status is not None:
            self.on_status(self)

    @property
    def alive(self) -> bool:
        return self.go is not None and self.status is not None and \
            not self.status.done.done()

    def send(self, tag: bytes, spec: dict[str, Any] | None = None,
             fds: list[int] | None = None) -> None:
        """A message to the cell's init (B) on the session socket: one tag byte (B reads
        nothing else: parsing JSON in B cost ~60 copy-on-write faults a run, B's heap
        being shared with the candidate it forked ahead), then the run's spec for the
        candidate (`encode_spec`). Tags: G go, M go after attaching the session's trees
        (its first run in this cell), g and m the same for the session's last run (no
        candidate forked ahead after it), S stop, R reset."""
        if self.go is None:
            raise SandboxStartError(f"cell {self.id} is closed")
        data = tag if spec is None else tag + encode_spec(spec)
        if fds:
            socket.send_fds(self.go, [data], fds)
        else:
            self.go.sendmsg([data])

    def stop(self) -> None:
        """Kill the run in flight (every process but the cell's init)."""
        try:
            self.send(b"S")
        except (OSError, SandboxStartError):
            self.kill()

    def kill(self) -> None:
        """Kill the whole cell (its init, hence its namespaces and every process)."""
        try:
            self.pool.send_zygote({"op": "kill", "cell": self.id})
        except ZygoteDied:
            self.pool.cgroups.kill_all(self.rel)

    def open_files(self) -> CellFiles:
        """The cell's cgroup files, reopened if `rest_files` closed them."""
        if self.files is None:
            if self.go is None:
                raise SandboxStartError(f"cell {self.id} is closed")
            self.files = self.pool.cgroups.open_files(self.rel)
        return self.files

    def rest_files(self) -> None:
        """Between runs on a dense pool (PoolConfig.dense_after), close the cgroup files:
        a session holding its cell then costs 1 descriptor, not 10; the next run
        reopens them (`open_files`). Below that density nothing changes."""
        if self.files is not None and len(self.pool._live) > self.pool.config.dense_after:
            self.files.close()
            self.files = None

    def discard(self) -> None:
        """Close an unused cell: its init sees EOF, everything in it dies, and its cgroup
        goes to the janitor."""
        self.pool.release(self)


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
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.cgroups: CgroupDriver = None  # type: ignore[assignment]
        self.runtime: Runtime = None  # type: ignore[assignment]
        self.python_names: frozenset[str] = frozenset()
        self.recycles = False  # may a cleanly closed session's cell serve another (start)
        self.devnull = -1
        self._zproc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._ready: deque[Cell] = deque()
        self._warming = 0
        self._refilling = True  # between the low-water mark and the target (_refill)
        self._seq = 0
        self._in_use = 0
        self._peak_value, self._peak_at = 0, 0.0
        self._live: dict[str, Cell] = {}
        self._failures = 0
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
        self.image_guard: ImageGuard | None = None
        """Verifies `PoolConfig.image` (image_verify.py); None without an image."""

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> CellPool:
        self.loop = asyncio.get_running_loop()
        self._start_sync()
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
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
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
        _build_root_template(self.root, self.image_guard.image.rootfs
                             if self.image_guard is not None else "/")
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
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        logf = open(os.path.join(self.dir, "zygote.log"), "ab")
        script_fd = -1
        try:
            # Run from a copy in the pool's root-only state dir: candidates share this
            # interpreter (and its argv) and need not learn where the project lives.
            # Started as /dev/fd/N: its command line (which a candidate in this
            # interpreter reads in /proc/self/cmdline) names no host path.
            script = os.path.join(self.dir, "zygote.py")
            shutil.copyfile(ZYGOTE, script)
            script_fd = os.open(script, os.O_RDONLY)
            preexec = None
            if self.image_guard is not None:
                from trialbox.sandbox.image_root import zygote_preexec
                preexec = zygote_preexec(self.image_guard.image)
            self._zproc = subprocess.Popen(
                [self.config.python, "-I", "-B", f"/dev/fd/{script_fd}"], preexec_fn=preexec,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logf,
                pass_fds=[child.fileno(), script_fd], cwd="/", close_fds=True,
                env={"LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin",
                     "TRIALBOX_CTL_FD": str(child.fileno())})
        finally:
            logf.close()
            child.close()
            if script_fd >= 0:
                os.close(script_fd)
        self._ctl = parent
        ro_binds = [["/usr", "/usr"], ["/etc/alternatives", "/etc/alternatives"]]
        ro_binds += [[d, d] for d in etc_runtime_dirs()]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.isdir(top) and not os.path.islink(top):
                ro_binds.append([top, top])
        env = BASE_ENV
        if self.image_guard is not None:
            from trialbox.sandbox.image_root import ro_binds as image_binds
            ro_binds = image_binds(self.image_guard.image)
            env = {**BASE_ENV, **dict(self.image_guard.image.env)}
        dev_binds = [[f"/dev/{n}", f"/dev/{n}"] for n in DEV_NODES]
        config = {"op": "config", "root": self.root, "ro_binds": ro_binds,
                  "dev_binds": dev_binds, "hostname": "sandbox",
                  "seccomp": build_filter().hex(), "preload": list(self.config.preload),
                  "env": env, "mounts": MOUNT_TARGETS,
                  "preload_sources": [list(x) for x in self.config.preload_sources],
                  "native": self.native_path}
        import json
        parent.sendmsg([json.dumps(config).encode()])
        parent.settimeout(30)
        try:
            hello = parent.recv(4096)
        except OSError as e:
            raise ZygoteDied(f"zygote did not answer: {e}; {self.zygote_log_tail()}") from e
        if not hello:
            raise ZygoteDied(f"zygote exited at start: {self.zygote_log_tail()}")
        self.native = bool(json.loads(hello).get("native"))
        if self.native_path is not None and not self.native:
            why = f"the zygote could not load {self.native_path}: {self.zygote_log_tail()}"
            if self.config.native == "on":
                raise SandboxUnavailable(why)
            log.warning("cells run their hot path in Python (slower): %s", why)
        parent.settimeout(None)
        parent.setblocking(True)

    def zygote_log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "zygote.log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 2000))
                tail = f.read().decode(errors="replace").strip()
        except OSError:
            return "(no zygote log)"
        return tail[-800:] or "(zygote log empty)"

    def send_zygote(self, msg: dict[str, object], fds: list[int] | None = None) -> None:
        import json
        if self._ctl is None or self.closed:
            raise ZygoteDied("the pool is closed")
        try:
            if fds:
                socket.send_fds(self._ctl, [json.dumps(msg).encode()], fds)
            else:
                self._ctl.sendmsg([json.dumps(msg).encode()])
        except OSError as e:
            raise ZygoteDied(f"zygote is gone ({e}); {self.zygote_log_tail()}") from e

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
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._zproc is not None:
            try:
                self._zproc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._zproc.kill()
                self._zproc.wait()
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
        if self.devnull >= 0:
            os.close(self.devnull)
            self.devnull = -1

    # ---------------------------------------------------------------- uids
    def take_uid(self) -> int:
        for _ in range(self.config.uid_count):
            uid = self.config.uid_base + self._uid_next
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
        if self._zproc is not None and self._zproc.poll() is None:
            return
        log.warning("zygote exited (%s); starting a new one: %s",
                    self._zproc.returncode if self._zproc else None, self.zygote_log_tail())
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
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
            procs, cell.files = await self.loop.run_in_executor(
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
            self.send_zygote({"op": "warm", "cell": cell.id, "net": net},
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

    def _create_cgroup(self, rel: str, limits: Limits) -> tuple[list[str], CellFiles]:
        procs = self.cgroups.create(rel, limits)
        return procs, self.cgroups.open_files(rel)

    async def acquire(self, net: bool = False, fresh: bool = False) -> Cell:
        """A ready cell (warm if one is waiting, prepared now otherwise). `fresh`: one
        that has served no session (a recycled cell's init may still be renewing its
        network namespace; a network gate must attach to the one its candidates get)."""
        if self.closed:
            raise ZygoteDied("the pool is closed")
        self._in_use += 1
        self._note_demand()
        if self._zproc is not None and self._zproc.poll() is not None:
            while self._ready:  # cells of a dead zygote die with it
                self.release(self._ready.popleft())
        try:
            if not net and not fresh:
                while self._ready:
                    cell = self._ready.popleft()
                    if cell.status is not None and not cell.status.done.done():
                        self._refill()
                        return cell
                    self.release(cell)
            self._refill()
            return await self._make_cell(net)
        except BaseException:
            self._in_use -= 1
            raise

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
            if self._zproc is not None and self._zproc.poll() is not None:
                self._failures = 0  # the zygote died: the next warm restarts it
            else:
                return
        # Refill in bursts, from a low-water mark back up to the target, so a cell
        # taken and handed back (recycled) a moment later does not start a warm-up
        # each time. With both rules, a judge's steady take-and-return stops making
        # and destroying a cell every ~2 attempts.
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


DEV_NODES = ("null", "zero", "full", "random", "urandom")

PASSWD = """root:x:0:0:root:/root:/usr/sbin/nologin
sandbox:x:1000:1000:sandbox:/workspace:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
GROUP = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"


def etc_runtime_dirs() -> list[str]:
    """Configuration of runtimes under /usr that Debian keeps under /etc (a JDK's
    `conf/security/java.security` is a link to /etc/java-17-openjdk/...: without it no
    JVM starts). Bound read-only like /usr; nothing else of /etc is visible."""
    import glob
    return sorted(d for d in glob.glob("/etc/java-*-openjdk")
                  if os.path.isdir(d) and not os.path.islink(d))


def _build_root_template(root: str, src: str = "/") -> None:
    """The skeleton each cell binds read-only as `/`: mount points, a few /etc files.

    Only the declared runtime (/usr, plus /etc/alternatives and the loader cache that
    programs under /usr need) is bound in; nothing else of the host is visible.
    """
    for d in ("usr", "etc", "dev", "dev/shm", "proc", "tmp", "workspace", "etc/alternatives",
              *(e.lstrip("/") for e in etc_runtime_dirs())):
        os.makedirs(os.path.join(root, d), mode=0o755, exist_ok=True)
    for top in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        host = os.path.join(src, top)
        target = os.path.join(root, top)
        if os.path.islink(host):
            if not os.path.lexists(target):
                os.symlink(os.readlink(host), target)
        elif os.path.isdir(host):
            os.makedirs(target, exist_ok=True)
    files = {
        "etc/passwd": PASSWD, "etc/group": GROUP, "etc/hostname": "sandbox\n",
        "etc/hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
        "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        "etc/resolv.conf": "",
    }
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    for rel in ("etc/ld.so.cache", "etc/ld.so.conf"):
        if os.path.isfile(os.path.join(src, rel)):
            shutil.copyfile(os.path.join(src, rel), os.path.join(root, rel))
    if not os.path.lexists(os.path.join(root, "etc/localtime")):
        os.symlink("/usr/share/zoneinfo/Etc/UTC", os.path.join(root, "etc/localtime"))
    for n in DEV_NODES:
        open(os.path.join(root, "dev", n), "a").close()
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        p = os.path.join(root, "dev", name)
        if not os.path.lexists(p):
            os.symlink(target, p)
    # Where Harbor-style tasks (trialbox.judge.harbor) look: /app is the session's
    # workspace; /tests, /logs and /solution lie in its private /tmp.
    for name, target in (("app", "/workspace"), ("tests", "/tmp/tests"),
                         ("logs", "/tmp/logs"), ("solution", "/tmp/solution")):
        p = os.path.join(root, name)
        if not os.path.lexists(p):
            os.symlink(target, p)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
