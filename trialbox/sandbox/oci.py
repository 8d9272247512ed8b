"""Sessions over OCI bundles: the machinery the `gvisor` and `container` tiers share.

A session is one long-lived container run by an OCI runtime (`runsc`, `runc`, `crun`)
whose process 1 is a small fork server (forkserver.py, under the sandbox's own
/usr/bin/python3); each run is one fork of it, so a warm run costs a fork and an exec,
not a container start (~100-200 ms). Per session, on the host:

    <state>/<owner>/s/<n>/fs/         a tmpfs of Limits.disk_mb: work/, tmp/, shm/
    <state>/<owner>/s/<n>/config.json the bundle (root: the provider's rootfs skeleton)
    <state>/<owner>/runtime/          the OCI runtime's own state (--root)
    <cgroup>/trialbox-oci/<owner>/<n> the session's cgroup (memory, cpu, pids accounting)

The container sees a read-only root: a skeleton of mount points and a few /etc files,
the host's /usr (and /etc/alternatives) bound read-only — the same view as the namespace
tier's cells (pool.py) — and the session's work/, tmp/, shm/ at /workspace, /tmp,
/dev/shm. No network but loopback unless Limits.network. Runs drop to uid 1000, no
capabilities, no_new_privs, the namespace tier's seccomp deny-list (seccomp.py), and
RLIMIT_NPROC=Limits.pids.

Everything is measured from outside: the supervisor (this module) counts output, times
the run, reads CPU and memory from the session's cgroup and sends the fork server a kill
when a limit is passed; the fork server then kills every process in the sandbox but
itself before it reports the end of the run. Files are read and written on the host
side, never through the candidate.

`<owner>` carries the supervisor's pid and start time (pool.owner_id): a provider
starting up reaps what dead supervisors left behind — containers (`runtime delete
--force`), processes in their cgroups, cgroups, mounts, directories.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trialbox.errors import SandboxStartError, SandboxUnavailable, UsageError
from trialbox.sandbox import mounts
from trialbox.sandbox.cgroups import CellFiles, CgroupDriver
from trialbox.sandbox.pool import (BASE_ENV, DEV_NODES, _build_root_template, _owner_alive,
                                   owner_id, system_runtime)
from trialbox.sandbox.seccomp import build_filter
from trialbox.types import ExecResult, ExecStatus, Limits, Runtime

log = logging.getLogger("trialbox.sandbox.oci")

FORKSERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver.py")
HEADER = struct.Struct("<cI")
SANDBOX_UID = 1000
"""The uid (and gid) runs have inside the sandbox."""
POLL_S = 0.02
"""How often a run's CPU time and memory are read from its cgroup."""
STOP_GRACE_S = 3.0
"""How long the fork server has to confirm a kill before the container is destroyed."""
DISK_SLACK = 64 * 1024
MiB = 1 << 20


@dataclass(frozen=True)
class Engine:
    """How to drive one OCI runtime binary."""

    name: str
    """`runsc`, `runc` or `crun`."""
    binary: str
    """Absolute path of the runtime."""
    flags: tuple[str, ...] = ()
    """Global flags before the subcommand (runsc: --platform, --network, ...)."""
    userns: bool = True
    """Run the container in a user namespace (container 0-65535 -> host uid_base...).
    gVisor has its own user namespace and needs none on the host."""
    join_cgroup: bool = False
    """Put the runtime process into the session's cgroup before it starts (runsc runs
    with --ignore-cgroups: its own cgroup set-up, with a pids limit, breaks it here)
    instead of naming the cgroup in the bundle (runc, crun)."""
    hide_cgroup2: bool = False
    """Run the runtime in a mount namespace without the host's cgroup2 mount (crun
    refuses a hybrid v1 + empty v2 layout)."""

    def argv(self, root: str, *args: str) -> list[str]:
        cmd = [self.binary, "--root", root, *self.flags, *args]
        if self.hide_cgroup2:
            cmd = ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh",
                   "-c", "umount -l /sys/fs/cgroup/unified 2>/dev/null; exec \"$@\"", "sh",
                   *cmd]
        return cmd


@dataclass(frozen=True)
class OciConfig:
    """Where an OCI-tier provider keeps its state and how many sessions it keeps warm."""

    state_dir: str = "/run/trialbox-oci"
    """Host directory for bundles, session tmpfs mounts and the runtime's state."""
    python: str = "/usr/bin/python3"
    """The runtime's interpreter (runs the fork server and sandboxed Python)."""
    warm: int = 2
    """Sessions started ahead of time (container up, fork server ready)."""
    uid_base: int = 1_100_000
    """Host uid that container uid 0 maps to (container tier's user namespace)."""
    default_limits: Limits = field(default_factory=Limits)
    """Limits warm sessions are prepared with (disk size; network off)."""
    start_timeout_s: float = 20.0
    """How long a container may take to start before the start counts as failed."""

    def __post_init__(self) -> None:
        if not 0 <= self.warm <= 64:
            raise UsageError(f"OciConfig.warm must be 0..64, got {self.warm}")
        if self.uid_base < 65_536:
            raise UsageError("OciConfig.uid_base must be >= 65536 (above every real user)")


# ------------------------------------------------------------------ the bundle

def _seccomp_file(path: str) -> None:
    with open(path, "wb") as f:
        f.write(build_filter())


def build_rootfs(root: str) -> None:
    """The read-only root skeleton (the namespace tier's, pool.py) plus /.tb for the
    fork server."""
    _build_root_template(root)
    os.makedirs(os.path.join(root, ".tb"), exist_ok=True)
    os.makedirs(os.path.join(root, "sys"), exist_ok=True)


def bundle_config(engine: Engine, rootfs: str, tb_dir: str, fs: str, python: str,
                  limits: Limits, cgroup: str | None, uid_base: int) -> dict[str, Any]:
    """The OCI runtime spec of one session's container."""
    ro = ["rbind", "ro", "nosuid", "nodev"]
    mnts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "noexec", "mode=755", "size=64k"]},
        {"destination": "/usr", "type": "bind", "source": "/usr", "options": ro},
        {"destination": "/.tb", "type": "bind", "source": tb_dir, "options": ro},
        {"destination": "/workspace", "type": "bind", "source": os.path.join(fs, "work"),
         "options": ["rbind", "rw", "nosuid", "nodev"]},
        {"destination": "/tmp", "type": "bind", "source": os.path.join(fs, "tmp"),
         "options": ["rbind", "rw", "nosuid", "nodev"]},
        {"destination": "/dev/shm", "type": "bind", "source": os.path.join(fs, "shm"),
         "options": ["rbind", "rw", "nosuid", "nodev"]},
    ]
    if os.path.isdir("/etc/alternatives"):
        mnts.insert(3, {"destination": "/etc/alternatives", "type": "bind",
                        "source": "/etc/alternatives", "options": ro})
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.isdir(top) and not os.path.islink(top):
            mnts.append({"destination": top, "type": "bind", "source": top, "options": ro})
    if engine.name != "runsc":  # runsc makes its own /dev nodes
        for n in DEV_NODES:
            mnts.append({"destination": f"/dev/{n}", "type": "bind", "source": f"/dev/{n}",
                         "options": ["bind", "nosuid", "noexec"]})
    caps = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL"]
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    if not limits.network:
        namespaces.append({"type": "network"})
    linux: dict[str, Any] = {"namespaces": namespaces,
                             "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list",
                                             "/proc/sched_debug", "/sys/firmware",
                                             "/proc/scsi"],
                             "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger",
                                               "/proc/irq", "/proc/bus"]}
    if engine.userns:
        namespaces.append({"type": "user"})
        linux["uidMappings"] = [{"containerID": 0, "hostID": uid_base, "size": 65536}]
        linux["gidMappings"] = [{"containerID": 0, "hostID": uid_base, "size": 65536}]
    if cgroup is not None:
        linux["cgroupsPath"] = "/" + cgroup
    return {
        "ociVersion": "1.0.2",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": [python, "-I", "-B", "/.tb/forkserver.py"],
            "env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": "sandbox",
        "mounts": mnts,
        "linux": linux,
    }


# ------------------------------------------------------------------ the channel

class _Channel:
    """Frames from the fork server (the container's stdout), read on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int,
                 on_frame: Callable[[bytes, bytes], None], on_eof: Callable[[], None]):
        self.loop, self.fd = loop, fd
        self.on_frame, self.on_eof = on_frame, on_eof
        self.buf = bytearray()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 1 << 17)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            self.on_eof()
            return
        self.buf += data
        while len(self.buf) >= HEADER.size:
            tag, n = HEADER.unpack_from(self.buf)
            if len(self.buf) < HEADER.size + n:
                break
            payload = bytes(self.buf[HEADER.size:HEADER.size + n])
            del self.buf[:HEADER.size + n]
            self.on_frame(tag, payload)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1


class Container:
    """One running container whose init is the fork server."""

    def __init__(self, provider: OciProvider, sid: str, sdir: str, limits: Limits):
        self.provider, self.sid, self.sdir, self.limits = provider, sid, sdir, limits
        self.cid = f"{provider.id}-{sid}"
        self.cgroup = f"trialbox-oci/{provider.id}/{sid}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.chan: _Channel | None = None
        self.files: CellFiles | None = None
        self.hello: asyncio.Future[None] = provider.loop.create_future()
        self.hello.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.on_frame: Callable[[bytes, bytes], None] | None = None
        self.on_eof: Callable[[], None] | None = None
        self.dead = False

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        p = self.provider
        fs = os.path.join(self.sdir, "fs")
        config = bundle_config(p.engine, p.rootfs, p.tb_dir, fs, p.config.python,
                               self.limits, None if p.engine.join_cgroup else self.cgroup,
                               p.config.uid_base)
        with open(os.path.join(self.sdir, "config.json"), "w") as f:
            json.dump(config, f)
        procs = p.cgroups.create(self.cgroup, p.host_limits(self.limits))
        self.files = p.cgroups.open_files(self.cgroup)
        join = procs if p.engine.join_cgroup else []

        def enter() -> None:  # in the child, before exec: into the session's cgroup
            for path in join:
                with open(path, "w") as fh:
                    fh.write("0")
            os.setsid()

        argv = p.engine.argv(p.runtime_root, "run", "--bundle", self.sdir, self.cid)
        if self.limits.network:  # runsc: the host's network (others: no netns in the spec)
            argv = [("--network=host" if a == "--network=none" else a) for a in argv]
        logf = open(os.path.join(self.sdir, "runtime.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                preexec_fn=enter, close_fds=True, cwd=self.sdir,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
        finally:
            logf.close()
        assert self.proc.stdout is not None
        fd = os.dup(self.proc.stdout.fileno())
        self.proc.stdout.close()
        self.chan = _Channel(p.loop, fd, self._frame, self._eof)
        try:
            await asyncio.wait_for(asyncio.shield(self.hello), p.config.start_timeout_s)
        except BaseException:
            self.destroy()
            raise

    def _frame(self, tag: bytes, payload: bytes) -> None:
        if tag == b"H" and not self.hello.done():
            self.hello.set_result(None)
        elif self.on_frame is not None:
            self.on_frame(tag, payload)

    def _eof(self) -> None:
        self.dead = True
        if not self.hello.done():
            self.hello.set_exception(SandboxStartError(
                f"{self.provider.engine.name} container exited at start: {self.log_tail()}"))
        if self.on_eof is not None:
            self.on_eof()

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.sdir, "runtime.log"), "rb") as f:
                return f.read()[-800:].decode(errors="replace").strip() or "(no log)"
        except OSError:
            return "(no log)"

    def send(self, tag: bytes, payload: bytes = b"") -> None:
        if self.proc is None or self.proc.stdin is None or self.dead:
            raise SandboxStartError("the session's container is gone")
        self.proc.stdin.write(HEADER.pack(tag, len(payload)) + payload)
        self.proc.stdin.flush()

    def destroy(self) -> None:
        """Kill and delete the container, its cgroup and processes. Blocking, idempotent."""
        self.dead = True
        if self.chan is not None:
            self.chan.close()
            self.chan = None
        if self.files is not None:
            self.files.close()
            self.files = None
        p = self.provider
        if self.proc is not None:
            if self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()  # EOF: the fork server kills all and exits
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.cgroups.kill_all(self.cgroup)
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        p.delete_container(self.cid)
        p.remove_cgroup(self.cgroup)


# ------------------------------------------------------------------ the provider

class OciProvider:
    """Hands out sessions of one OCI-runtime tier (a `SandboxProvider`). Subclasses
    (gvisor.py, container.py) choose the engine; `start()` checks the node, reaps what
    dead supervisors left and warms `OciConfig.warm` sessions."""

    tier = "oci"

    def __init__(self, engine: Engine, config: OciConfig | None = None):
        self.engine = engine
        self.config = config or OciConfig()
        self.id = owner_id()
        self.dir = os.path.join(self.config.state_dir, self.id)
        self.rootfs = os.path.join(self.dir, "rootfs")
        self.tb_dir = os.path.join(self.dir, "tb")
        self.runtime_root = os.path.join(self.dir, "runtime")
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.cgroups: CgroupDriver = None  # type: ignore[assignment]
        self.runtime: Runtime = None  # type: ignore[assignment]
        self.reaped: dict[str, int] = {}
        self.python_names: frozenset[str] = frozenset()
        self._seq = 0
        self._ready: list[OciSession] = []
        self._warming = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.started = False

    def host_limits(self, limits: Limits) -> Limits:
        """What the session's host cgroup enforces for a run with `limits` (on top of
        what the sandbox holds when the run starts)."""
        return limits.with_(pids=limits.pids + 1)  # the fork server

    def run_rlimits(self, limits: Limits) -> dict[str, list[int]]:
        cpu = int(limits.cpu_s * 2) + 5  # a backstop; the cgroup's total is the limit
        return {"RLIMIT_NOFILE": [limits.open_files, limits.open_files],
                "RLIMIT_CPU": [cpu, cpu + 1], "RLIMIT_CORE": [0, 0],
                "RLIMIT_FSIZE": [limits.disk_bytes, limits.disk_bytes]}

    async def start(self) -> OciProvider:
        self.loop = asyncio.get_running_loop()
        await self.loop.run_in_executor(None, self._start_sync)
        self.started = True
        self._refill()
        return self

    def check(self) -> None:
        """Raise SandboxUnavailable naming what this node lacks for the tier."""
        if os.geteuid() != 0:
            raise SandboxUnavailable(f"the {self.tier} tier needs root (it creates "
                                     "containers, cgroups and mounts); run as root")
        if not os.access(self.engine.binary, os.X_OK):
            raise SandboxUnavailable(
                f"the {self.tier} tier needs {self.engine.name} at {self.engine.binary}; "
                f"install it: apt-get install {self.engine.name}")

    def _start_sync(self) -> None:
        self.check()
        self.cgroups = CgroupDriver.detect()
        self.runtime = system_runtime(self.config.python)
        self.python_names = frozenset({"python", "python3", self.config.python,
                                       os.path.realpath(self.config.python)})
        self.reaped = reap_orphans(self.config.state_dir, self.cgroups)
        if any(self.reaped.values()):
            log.warning("reaped what dead %s supervisors left: %s", self.tier, self.reaped)
        for d in (self.dir, self.tb_dir, self.runtime_root, os.path.join(self.dir, "s")):
            os.makedirs(d, exist_ok=True)
        os.chmod(self.dir, 0o711 if self.engine.userns else 0o700)
        with open(os.path.join(self.dir, "engine"), "w") as f:
            f.write(" ".join(self.engine.argv(self.runtime_root)))
        build_rootfs(self.rootfs)
        shutil.copyfile(FORKSERVER, os.path.join(self.tb_dir, "forkserver.py"))
        _seccomp_file(os.path.join(self.tb_dir, "seccomp.bpf"))
        for d in (self.tb_dir,):
            os.chmod(d, 0o755)

    # -- sessions ----------------------------------------------------------------
    async def open(self, limits: Limits | None = None) -> OciSession:
        """A session with these limits: a warm one when its shape fits (network off),
        else one started now (a cold start)."""
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a trialbox.types.Limits, got "
                             f"{type(limits).__name__}; e.g. Limits(wall_s=2)")
        if not self.started or self.closed:
            raise UsageError(f"the {self.tier} provider is not started (await "
                             "provider.start()) or already closed")
        limits = limits or self.config.default_limits
        while not limits.network and self._ready:
            sb = self._ready.pop()
            self._refill()
            if sb.container is not None and sb.container.alive:
                sb.reshape(limits)
                return sb
            await sb.close()
        sb = await self._new_session(limits)
        self._refill()
        return sb

    async def _new_session(self, limits: Limits) -> OciSession:
        self._seq += 1
        sb = OciSession(self, f"s{self._seq}", limits)
        try:
            sb.make_workspace()
            await sb.start_container()
        except BaseException:
            await sb.close()
            raise
        return sb

    def _refill(self) -> None:
        if self.closed or not self.started:
            return
        while len(self._ready) + self._warming < self.config.warm:
            self._warming += 1
            task = self.loop.create_task(self._warm_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _warm_one(self) -> None:
        try:
            sb = await self._new_session(self.config.default_limits)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("could not warm a %s session: %s", self.tier, e)
            return
        finally:
            self._warming -= 1
        if self.closed:
            await sb.close()
        else:
            self._ready.append(sb)

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until the warm sessions are ready (benchmarks, tests)."""
        deadline = time.monotonic() + timeout
        while self._warming and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Close every session this provider still holds; remove its state."""
        if self.closed:
            return
        self.closed = True
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for sb in self._ready:
            await sb.close()
        self._ready.clear()
        if self.loop is not None:
            await self.loop.run_in_executor(None, self._remove_state)

    def close_sync(self) -> None:
        """`close` without an event loop (interpreter exit): every container, cgroup,
        mount and directory of this provider goes."""
        if self.closed:
            return
        self.closed = True
        for sb in self._ready:
            sb.closed = True
            sb._teardown(sb.container)
        self._ready.clear()
        if self.started:
            self._remove_state()

    def _remove_state(self) -> None:
        for cid in self.list_containers():
            self.delete_container(cid)
        for mp in mounts.mounts_under(self.dir):
            mounts.umount(mp)
        if self.cgroups is not None:
            self.remove_cgroup(f"trialbox-oci/{self.id}")
        shutil.rmtree(self.dir, ignore_errors=True)

    async def __aenter__(self) -> OciProvider:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- host state ----------------------------------------------------------------
    def list_containers(self, root: str | None = None) -> list[str]:
        root = root or self.runtime_root
        if not os.path.isdir(root):
            return []
        out = subprocess.run(self.engine.argv(root, "list", "--quiet"), capture_output=True,
                             text=True, timeout=30, check=False)
        return [c for c in out.stdout.split() if c and c != "ID"]

    def delete_container(self, cid: str, root: str | None = None) -> None:
        subprocess.run(self.engine.argv(root or self.runtime_root, "delete", "--force", cid),
                       capture_output=True, timeout=30, check=False)

    def remove_cgroup(self, rel: str) -> None:
        for _ in range(100):
            self.cgroups.kill_all(rel)
            for d in self.cgroups.dirs(rel):
                if os.path.isdir(d):
                    for c in os.listdir(d):
                        if os.path.isdir(os.path.join(d, c)):
                            self.cgroups.kill_all(f"{rel}/{c}")
            if self.cgroups.remove(rel):
                return
            time.sleep(0.02)
        log.warning("cgroup %s still busy", rel)


def reap_orphans(state_dir: str, driver: CgroupDriver) -> dict[str, int]:
    """Remove what dead OCI-tier supervisors left: their containers (each runtime's
    `delete --force`), processes in their cgroups, the cgroups, mounts, directories."""
    counts = {"containers": 0, "processes": 0, "cgroups": 0, "mounts": 0}
    if os.path.isdir(state_dir):
        for name in os.listdir(state_dir):
            if _owner_alive(name):
                continue
            path = os.path.join(state_dir, name)
            root = os.path.join(path, "runtime")
            try:
                with open(os.path.join(path, "engine")) as f:
                    cmd = f.read().split()
            except OSError:
                cmd = []
            if cmd and os.path.isdir(root):
                listed = subprocess.run([*cmd, "list", "--quiet"], capture_output=True,
                                        text=True, timeout=30, check=False)
                for cid in listed.stdout.split():
                    subprocess.run([*cmd, "delete", "--force", cid], capture_output=True,
                                   timeout=30, check=False)
                    counts["containers"] += 1
            for mp in mounts.mounts_under(path):
                mounts.umount(mp)
                counts["mounts"] += 1
            shutil.rmtree(path, ignore_errors=True)
    for top in driver.dirs("trialbox-oci"):
        if not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            if not os.path.isdir(os.path.join(top, name)) or _owner_alive(name):
                continue
            rel = f"trialbox-oci/{name}"
            for _ in range(50):
                pids = driver.pids(rel) + [p for d in os.listdir(os.path.join(top, name))
                                           if os.path.isdir(os.path.join(top, name, d))
                                           for p in driver.pids(f"{rel}/{d}")]
                if not pids:
                    break
                counts["processes"] += len(pids)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.02)
            for d in os.listdir(os.path.join(top, name)):
                if os.path.isdir(os.path.join(top, name, d)):
                    driver.remove(f"{rel}/{d}")
            if driver.remove(rel):
                counts["cgroups"] += 1
    return counts


# ------------------------------------------------------------------ the session

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
        self.uid = SANDBOX_UID + (provider.config.uid_base if provider.engine.userns else 0)
        """Host uid of the workspace's files (the sandbox's uid 1000, as the host sees it)."""

    @property
    def workspace(self) -> str:
        return os.path.join(self.fs, "work")

    def make_workspace(self) -> None:
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
        c = Container(self.provider, self.sid, self.dir, self.limits)
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

    async def park(self) -> None:
        """The container is the session's; between runs it holds only an idle fork
        server (no candidate process survives a run). Nothing to hand back."""

    async def close(self) -> None:
        if self.closed:
            return
        await self.stop()
        async with self._lock:
            self.closed = True
            c, self.container = self.container, None
            await self.provider.loop.run_in_executor(None, self._teardown, c)

    def _teardown(self, c: Container | None) -> None:
        if c is not None:
            c.destroy()
        if os.path.isdir(self.fs):
            for mp in mounts.mounts_under(self.fs):
                mounts.umount(mp)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- runs -------------------------------------------------------------------------
    async def exec(self, argv: Sequence[str], *, stdin: bytes = b"",
                   limits: Limits | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = "/workspace",
                   pass_fds: Mapping[int, int] | None = None,
                   last: bool = False) -> ExecResult:
        self._check_open()
        if pass_fds:
            for fd in pass_fds.values():
                try:
                    os.close(fd)
                except (OSError, TypeError):
                    pass
            raise UsageError(f"pass_fds is not supported by the {self.tier} tier (host "
                             "fds cannot enter the sandbox); use the namespace tier")
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a trialbox.types.Limits, got "
                             f"{type(limits).__name__}; e.g. Limits(wall_s=2)")
        limits = limits or self.limits
        if limits.network != self.limits.network:
            raise UsageError("Limits.network is fixed when the session opens; open a "
                             f"session with Limits(network={limits.network})")
        if not isinstance(stdin, (bytes, bytearray, memoryview)):
            raise UsageError(f"stdin must be bytes, got {type(stdin).__name__}")
        spec = self._spec(argv, env, cwd, limits)
        async with self._lock:
            self._check_open()
            for _attempt in range(2):
                if self.container is None or not self.container.alive:
                    if self.container is not None:
                        old, self.container = self.container, None
                        await self.provider.loop.run_in_executor(None, old.destroy)
                    try:
                        await self.start_container()
                    except (SandboxStartError, SandboxUnavailable, OSError) as e:
                        return self._infra(f"no sandbox could be started: {e}")
                assert self.container is not None
                run = _Run(self, self.container, spec, bytes(stdin), limits)
                self._run = run
                try:
                    result = await run.run()
                finally:
                    self._run = None
                if not run.started and result.status is ExecStatus.INFRA:
                    continue  # nothing of the candidate's ran: once more, fresh container
                break
            return result

    def _infra(self, message: str) -> ExecResult:
        return ExecResult(status=ExecStatus.INFRA, message=message,
                          runtime=self.provider.runtime.id, tier=self.tier)

    def _spec(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str,
              limits: Limits) -> dict[str, Any]:
        if isinstance(argv, (str, bytes)) or not argv:
            raise UsageError("argv must be a non-empty list of strings, e.g. "
                             "['python3', 'main.py']")
        for a in argv:
            if not isinstance(a, str) or "\x00" in a:
                raise UsageError(f"every argv item must be a str without NUL, got {a!r}")
        run_env = dict(BASE_ENV)
        for k, v in (env or {}).items():
            if (not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k
                    or "\x00" in k + v):
                raise UsageError(f"env entries must be str -> str, keys without '=' or "
                                 f"NUL; got {k!r}: {v!r}")
            run_env[k] = v
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
                 limits: Limits):
        self.sb, self.c, self.spec, self.stdin, self.limits = sb, c, spec, stdin, limits
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
        self._timer: asyncio.TimerHandle | None = None

    def kill(self, reason: ExecStatus, message: str) -> None:
        if self.kill_reason is None and self.status is None and not self.done.done():
            self.kill_reason, self.kill_message = reason, message
            self.t_end = time.monotonic()
            try:
                self.c.send(b"K")
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
            files.begin_run(self.sb.provider.host_limits(limits))
            self.base_usage = files.base.usage_bytes
            self.oom_base = files.base.oom_kills
        except OSError as e:
            c.dead = True
            return self.sb._infra(f"could not set the session's cgroup limits: {e}")
        c.on_frame, c.on_eof = self._frame, self._eof
        self.t_go = time.monotonic()
        try:
            c.send(b"R", json.dumps(self.spec).encode())
            c.send(b"I", self.stdin)
        except (OSError, SandboxStartError) as e:
            c.dead = True
            c.on_frame = c.on_eof = None
            return self.sb._infra(f"could not start the run: {e}")
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
        if status is ExecStatus.MEMORY or self.c.dead:
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
            return (ExecStatus.MEMORY, None, 9,
                    f"memory passed Limits.memory_mb={self.limits.memory_mb}")
        if self.kill_reason is not None:
            return self.kill_reason, None, 9, self.kill_message
        st = self.status
        if st is None:
            if self.peak > 0.8 * self.limits.memory_bytes:  # the sandbox died near the cap
                return (ExecStatus.MEMORY, None, 9,
                        f"memory passed Limits.memory_mb={self.limits.memory_mb}")
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

    def _disk_full(self) -> bool:
        try:
            st = os.statvfs(self.sb.fs)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < DISK_SLACK
