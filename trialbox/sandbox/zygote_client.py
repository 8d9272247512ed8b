"""The zygote client: the supervisor's end of a pool's zygote and of the cells it forks.

The zygote (`zygote.py`) is a process in the runtime's own interpreter that prepares
cells: fresh namespaces, a cgroup, the read-only root built from the template made here
(`build_root_template`), the first candidate forked and waiting. This module starts it
(`Zygote`), speaks its control protocol, and holds each prepared cell's end (`Cell`): the
session socket that carries `go`s to the cell's init and its status records back
(`SocketReader`), and the compact spec a run's candidate reads (`encode_spec`). Which
cells exist and when is the warm pool's business (pool.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trialbox.errors import SandboxStartError, SandboxUnavailable, ZygoteDied
from trialbox.sandbox.cgroups import CellFiles
from trialbox.sandbox.procview import ProcView
from trialbox.sandbox.seccomp import build_filter
from trialbox.types import Limits, Runtime

if TYPE_CHECKING:
    from trialbox.sandbox.image import Image
    from trialbox.sandbox.pool import CellPool

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
MOUNT_TARGETS = ["/workspace", "/tmp", "/dev/shm"]
"""Where a session's work/, tmp/ and shm/ appear inside its cell."""
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
BASE_ENV = {"PATH": SANDBOX_PATH, "HOME": "/workspace", "LANG": "C.UTF-8",
            "TMPDIR": "/tmp", "USER": "sandbox", "LOGNAME": "sandbox",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
"""A run's environment unless it adds its own; the zygote holds it already (a run
that asks for exactly this environment does not rebuild it)."""


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


# ------------------------------------------------------------------ the zygote

class Zygote:
    """The supervisor's end of one zygote process: its control socket and its log
    (`<dir>/zygote.log`). `spawn` starts it with a cell configuration
    (`cell_config`); a pool spawns a new one when the last died."""

    def __init__(self, state_dir: str, python: str):
        self.dir, self.python = state_dir, python
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctl: socket.socket | None = None
        self.own_exe = False
        """Whether its cells make their own copy of the interpreter their executable."""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, config: dict[str, object],
              preexec: Callable[[], None] | None = None) -> bool:
        """Start the zygote and send it `config`; True if it loaded the cells' C hot
        path (`config["native"]`). ZygoteDied if it does not answer."""
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
            self.proc = subprocess.Popen(
                [self.python, "-I", "-B", f"/dev/fd/{script_fd}"], preexec_fn=preexec,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logf,
                pass_fds=[child.fileno(), script_fd], cwd="/", close_fds=True,
                env={"LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin",
                     "TRIALBOX_CTL_FD": str(child.fileno())})
        finally:
            logf.close()
            child.close()
            if script_fd >= 0:
                os.close(script_fd)
        self.ctl = parent
        parent.sendmsg([json.dumps(config).encode()])
        parent.settimeout(30)
        try:
            hello = parent.recv(4096)
        except OSError as e:
            raise ZygoteDied(f"zygote did not answer: {e}; {self.log_tail()}") from e
        if not hello:
            raise ZygoteDied(f"zygote exited at start: {self.log_tail()}")
        parent.settimeout(None)
        parent.setblocking(True)
        answer = json.loads(hello)
        self.own_exe = bool(answer.get("own_exe"))
        return bool(answer.get("native"))

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "zygote.log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 2000))
                tail = f.read().decode(errors="replace").strip()
        except OSError:
            return "(no zygote log)"
        return tail[-800:] or "(zygote log empty)"

    def send(self, msg: dict[str, object], fds: list[int] | None = None) -> None:
        """One control message (JSON), with descriptors. ZygoteDied if it is gone."""
        if self.ctl is None:
            raise ZygoteDied("the pool is closed")
        try:
            if fds:
                socket.send_fds(self.ctl, [json.dumps(msg).encode()], fds)
            else:
                self.ctl.sendmsg([json.dumps(msg).encode()])
        except OSError as e:
            raise ZygoteDied(f"zygote is gone ({e}); {self.log_tail()}") from e

    def detach(self) -> None:
        """Close the control socket (the zygote sees EOF and exits)."""
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None

    def close(self) -> None:
        """Detach and wait for the zygote to exit (killed after 5 s)."""
        self.detach()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cell_config(root: str, image: Image | None, preload: tuple[str, ...],
                preload_sources: tuple[tuple[str, str], ...],
                native: str | None, dev: str, empty: str,
                zygote_usr: bool) -> dict[str, object]:
    """The zygote's `config` message: what every cell sees, each through an overlay of
    its own (the template at `root` as `/`, the runtime, the device nodes at `dev`;
    `empty` is the overlays' second layer), the seccomp filter, the environment, the
    modules imported once, the C hot path's shared object, and whether the zygote runs
    from an overlay of /usr (`zygote_usr`: cells then make their copy of it their
    executable, zygote.set_exe)."""
    ro_binds = [["/usr", "/usr"], ["/etc/alternatives", "/etc/alternatives"]]
    ro_binds += [[d, d] for d in etc_runtime_dirs()]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.isdir(top) and not os.path.islink(top):
            ro_binds.append([top, top])
    env = BASE_ENV
    if image is not None:
        from trialbox.sandbox.image_root import ro_binds as image_binds
        ro_binds = image_binds(image)
        env = {**BASE_ENV, **dict(image.env)}
    config: dict[str, object] = {
            "op": "config", "root": root, "ro_binds": ro_binds,
            "dev": dev, "empty": empty, "hostname": "sandbox",
            "seccomp": build_filter().hex(), "preload": list(preload),
            "env": env, "mounts": MOUNT_TARGETS,
            "preload_sources": [list(x) for x in preload_sources],
            "native": native}
    if zygote_usr:
        config["zygote_usr"] = True
    return config


def build_dev_dir(path: str) -> None:
    """The lower layer of every cell's /dev: the device nodes a program needs (made here
    with the host's device numbers), the std* links and the /dev/shm mount point. Each
    cell sees it through an overlay of its own: binds of the host's nodes were the
    host's inodes, so a sandbox's inotify watch on /dev/null saw every write to it on
    the host, and a flock on it reached every other session."""
    os.makedirs(os.path.join(path, "shm"), mode=0o755, exist_ok=True)
    for n in DEV_NODES:
        p = os.path.join(path, n)
        if not os.path.lexists(p):
            os.mknod(p, 0o666 | stat.S_IFCHR, os.stat(f"/dev/{n}").st_rdev)
            os.chmod(p, 0o666)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        if not os.path.lexists(os.path.join(path, name)):
            os.symlink(target, os.path.join(path, name))


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


def encode_spec(spec: dict[str, Any], base_env: Mapping[str, str] = BASE_ENV) -> bytes:
    """A run's spec as the candidate reads it — in C (cell.c `enter`) or in Python
    (zygote.decode_spec): no JSON, whose parser in a freshly forked process costs
    ~80 copy-on-write faults. Little-endian: u32 uid; u8 n, n x (u8 resource, u64
    soft, u64 hard; all ones = unlimited); u8 m, m x u8 fd target; u16 length + cwd;
    then the program, NUL-separated: mode, path, argc, argv..., and `=` for the pool's
    own environment (`base_env`: BASE_ENV and an image's [env], which the candidate
    inherits) or its KEY=VALUE items."""
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
    program += ["="] if env == base_env else [f"{k}={v}" for k, v in env.items()]
    out.append(b"\0".join(x.encode("utf-8", "surrogatepass") for x in program))
    return b"".join(out)


class Cell:
    """One session's prepared sandbox (see zygote.py): used by one session, then gone."""

    def __init__(self, pool: CellPool, cid: str, net: bool, limits: Limits):
        self.pool, self.id, self.net, self.limits = pool, cid, net, limits
        self.rel = f"trialbox/{pool.id}/{cid}"
        self.files: CellFiles | None = None
        self.view: ProcView | None = None
        """What the cell's runs read in /proc/meminfo, /proc/stat, ... (procview.py)."""
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
                f"{self.error or self.pool.zygote.log_tail()}"))
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
        data = tag if spec is None else tag + encode_spec(spec, self.pool.env)
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


# ------------------------------------------------------------------ the cells' root

DEV_NODES = ("null", "zero", "full", "random", "urandom")

# The sandbox user's home is /nonexistent, not the workspace: a program that clears its
# environment (`env -i`, a login shell) gets HOME — and Python's user site, git's and
# bash's per-user files — from here, and a trusted verifier running in the answer's
# workspace must not read settings the answer planted there (docs/adversary.md, I).
# Programs still start with HOME=/workspace from BASE_ENV.
PASSWD = """root:x:0:0:root:/root:/usr/sbin/nologin
sandbox:x:1000:1000:sandbox:/nonexistent:/bin/sh
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


def build_root_template(root: str, src: str = "/") -> None:
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
