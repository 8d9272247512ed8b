"""Sessions over OCI bundles: the machinery the `gvisor` and `container` tiers share
(bundle, container, provider, reaper here; a session and its runs in ocisession.py).

A session is one long-lived container run by an OCI runtime (`runsc`, `runc`, `crun`)
whose process 1 is a small fork server (forkserver.py, under the sandbox's own
/usr/bin/python3); each run is one fork of it, so a warm run costs a fork and an exec,
not a container start (~100-200 ms). Per session, on the host:

    <state>/<owner>/s/<n>/fs/         a tmpfs of Limits.disk_mb: work/, tmp/, shm/
    <state>/<owner>/s/<n>/config.json the bundle (root: the provider's rootfs skeleton)
    <state>/<owner>/runtime/          the OCI runtime's own state (--root)
    <cgroup>/trialbox-oci/<owner>/<n> the session's cgroup (memory, cpu, pids accounting)

The container sees a read-only root: a skeleton of mount points and a few /etc files,
the host's /usr (and /etc/alternatives) — each through a read-only overlay of the
container's own, made in the runtime's mount namespace (`private_views`), the same view
as the namespace tier's cells (pool.py) — and the session's work/, tmp/, shm/ at
/workspace, /tmp, /dev/shm. No network but loopback unless Limits.network. Runs drop to uid 1000, no
capabilities, no_new_privs, the namespace tier's seccomp deny-list (seccomp.py), and
RLIMIT_NPROC=Limits.pids.

Everything is measured from outside: the supervisor (this module) counts output, times
the run, reads CPU and memory from the session's cgroup and sends the fork server a kill
when a limit is passed; the fork server then kills every process in the sandbox but
itself before it reports the end of the run. Files are read and written on the host
side, never through the candidate.

`<owner>` carries the supervisor's pid and start time (reaper.owner_id): a provider
starting up reaps what dead supervisors left behind — containers (`runtime delete
--force`), processes in their cgroups, cgroups, mounts, directories.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trialbox.errors import SandboxStartError, SandboxUnavailable, UsageError
from trialbox.sandbox import mounts
from trialbox.sandbox.cgroups import CellFiles, CgroupDriver
from trialbox.sandbox.cgroups import _mounts as _cgroup_mounts
from trialbox.sandbox.network import Gate, check_node, configure_sandbox_side, new_netns
from trialbox.sandbox.reaper import owner_alive, owner_id
from trialbox.sandbox.seccomp import build_filter
from trialbox.sandbox.uids import UidLease, lease
from trialbox.sandbox.userns import MAPPED, UNSHARE, make_userns
from trialbox.sandbox.zygote_client import (
    BASE_ENV,
    DEV_NODES,
    build_root_template,
    system_runtime,
)
from trialbox.types import Limits, Runtime

if TYPE_CHECKING:
    from trialbox.sandbox.image_verify import ImageGuard
    from trialbox.sandbox.ocisession import OciSession

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
LEND_GRACE_S = 2.0
"""A recyclable session handed out counts toward `OciConfig.warm` (it is expected
back) for this long; a session kept longer than that is replaced by a new warm one."""


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
    """Run the container in a user namespace (container 0-65535 -> a block of host uids
    of its session's own: uids.py, userns.py).
    gVisor has its own user namespace and needs none on the host."""
    join_cgroup: bool = False
    """Put the runtime process into the session's cgroup before it starts (runsc runs
    with --ignore-cgroups: its own cgroup set-up, with a pids limit, breaks it here)
    instead of naming the cgroup in the bundle (runc, crun)."""
    ctl_fd: int = 3
    """Where the fork server finds its control socket: 3, passed with --preserve-fds
    (runc and crun copy a foreground container's stdio through pipes of their own, which
    cannot carry fds); runsc (which has no --preserve-fds here) donates its stdin as it
    is: 0."""
    own_views: bool = False
    """Give each container overlays of its own of every read-only tree and of its
    device nodes (`private_views`): runc and crun, whose containers' files are served by
    the host's kernel. gVisor's kernel has its own inodes (its gofer's files)."""
    proc_views: tuple[str, ...] = ()
    """The /proc entries a session sees files of its own for, bound over the kernel's
    (procview.py): runc and crun, whose /proc is the host kernel's, all of
    procview.NAMES; gVisor, whose kernel shows its own, meminfo (its MemTotal is the
    host's)."""
    hide_cgroup2: bool = False
    """Run the runtime in a mount namespace without the host's cgroup2 mount (crun
    refuses a hybrid v1 + empty v2 layout)."""
    recycle: bool = False
    """Hand a closed session's container to the next `open()` once it is reset (no
    process alive, the workspace, /tmp and /dev/shm emptied; each run has an IPC
    namespace of its own) instead of destroying it: `OciProvider.recycle`. The fork
    server then holds CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SYS_ADMIN and CAP_SETPCAP (under
    gVisor the Sentry's capabilities, not the host's); every run drops them all, from
    its bounding set too."""

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
    recycle: bool = False
    """gvisor tier: hand a closed session's sandbox, reset, to the next `open()`
    (Engine.recycle: a warm run instead of a cold start per one-shot session, ~4x the
    one-shot rate here). Off by default: a recycled sandbox is one gVisor kernel for
    every session it serves — its clocks since boot, its TCP/IP statistics
    (/proc/net/snmp is the whole sandbox's), its pid counter — so a session can signal
    to the next. Turn it on only where consecutive sessions are one trust domain."""
    default_limits: Limits = field(default_factory=Limits)
    """Limits warm sessions are prepared with (disk size; network off)."""
    start_timeout_s: float = 20.0
    """How long a container may take to start before the start counts as failed."""
    net_egress: str = ""
    """The network namespace (a path, e.g. /run/netns/mirror) that connections allowed
    by `Limits.net_allow` are made from; empty: the supervisor's own (network.py)."""
    image: str = ""
    """A built image's directory (docs/images.md): the container's /usr (and the fork
    server's interpreter) come from it, verified in full at start and cheaply before each
    session; the same image the namespace tier takes as PoolConfig.image."""
    preload: tuple[str, ...] | None = None
    """Stdlib modules the fork server imports once, so runs find them loaded (None: its
    default, forkserver.PRELOAD). Each page of the server's heap costs every run's fork
    (under gVisor ~25-35 ms per fork here), so a judge passes a leaner set."""
    preload_sources: tuple[tuple[str, str], ...] = ()
    """(module name, source) of standalone helper modules the fork server imports once,
    so every run finds them loaded (e.g. the judge's codec and stub: compiling them in
    each run costs milliseconds under gVisor); as PoolConfig.preload_sources. Never
    anything secret."""

    def __post_init__(self) -> None:
        if not 0 <= self.warm <= 64:
            raise UsageError(f"OciConfig.warm must be 0..64, got {self.warm}")


# ------------------------------------------------------------------ the bundle

def _seccomp_file(path: str) -> None:
    with open(path, "wb") as f:
        f.write(build_filter())


def build_rootfs(root: str, src: str = "/") -> None:
    """The read-only root skeleton (the namespace tier's, pool.py) plus /.tb for the
    fork server; `src`: the root whose loader cache and top-level links it takes (an
    image's rootfs, or the host's)."""
    build_root_template(root, src)
    os.makedirs(os.path.join(root, ".tb"), exist_ok=True)
    os.makedirs(os.path.join(root, "sys"), exist_ok=True)


FORKSERVER_NOFILE = 4096
"""RLIMIT_NOFILE of the fork server (a run sets its own, Limits.open_files)."""
DEV_TMPFS_BYTES = 64 * 1024
_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
            "urandom": (1, 9), "tty": (5, 0)}
"""The nodes runc and crun bind into every container (their defaults and DEV_NODES)."""
CLONE_NEWNS, MS_REC, MS_PRIVATE, MS_NOEXEC = 0x20000, 0x4000, 1 << 18, 8


def make_dev_dir(path: str) -> None:
    """A 64 KiB tmpfs at `path` (not nodev) holding the device nodes a container gets."""
    os.makedirs(path, exist_ok=True)
    if mounts._libc.mount(b"tmpfs", path.encode(), b"tmpfs", mounts.MS_NOSUID | MS_NOEXEC,
                          f"size={DEV_TMPFS_BYTES},mode=755".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}")
    for name, (major, minor) in _DEVICES.items():
        node = os.path.join(path, name)
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(node, 0o666)


def private_views(dev: str, trees: Sequence[str], empty: str) -> None:
    """In the runtime's process before exec: a mount namespace of its own in which each
    of `trees` (every host tree the container is given read-only: its root skeleton,
    /.tb, /usr, /etc/alternatives, an image's tops) is covered by a read-only overlay
    of itself, and /dev by one of `dev` (make_dev_dir). The runtime builds the container
    from these, so what the container sees are this container's own inodes, not the
    host's nor another session's: an inotify watch on its /usr/bin/true or /dev/null
    sees no open by the host or a sibling, and a flock on them reaches no one (before:
    binds of the host's /usr and of the provider's skeleton and nodes, shared by every
    session).
    Its device nodes come from `dev`, so its mountinfo names no devtmpfs. The overlays
    go with the namespace when the container's last process exits."""
    libc = mounts._libc
    if (libc.unshare(CLONE_NEWNS) != 0
            or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0):
        raise OSError(ctypes.get_errno(), "a private mount namespace for the container "
                      "runtime")
    for tree in trees:
        mounts.overlay_view(tree, tree, empty)
    # not nodev: its nodes must open; read-only, as a device node on it can still be
    # written (the device, not the file)
    mounts.overlay_view(dev, "/dev", empty, mounts.MS_RDONLY | mounts.MS_NOSUID)


def readonly_trees(config: dict[str, Any]) -> list[str]:
    """The host trees a bundle gives its container read-only: its root and the sources
    of its read-only directory binds (what `private_views` covers with overlays)."""
    trees = [str(config["root"]["path"])]
    for m in config["mounts"]:
        if (m["type"] == "bind" and "ro" in m.get("options", ())
                and os.path.isdir(m["source"])):
            trees.append(str(m["source"]))
    return trees


def bundle_config(engine: Engine, rootfs: str, tb_dir: str, fs: str, python: str,
                  limits: Limits, cgroup: str | None, uid_base: int,
                  src: str = "/", userns: str = "", views: str = "") -> dict[str, Any]:
    """The OCI runtime spec of one session's container; `src`: where /usr (and
    /etc/alternatives) come from — an image's rootfs, or the host's; `userns`: the path
    of a user namespace (mapping uid_base...) for the container to join (userns.py);
    `views`: the session's /proc view files (procview.py), bound over the /proc entries
    `engine.proc_views` names."""
    ro = ["rbind", "ro", "nosuid", "nodev"]
    mnts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        *({"destination": f"/proc/{name}", "type": "bind",
           "source": os.path.join(views, name),
           "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}
          for name in (engine.proc_views if views else ())),
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "noexec", "mode=755", "size=64k"]},
        {"destination": "/usr", "type": "bind", "source": os.path.join(src, "usr"),
         "options": ro},
        {"destination": "/.tb", "type": "bind", "source": tb_dir, "options": ro},
        {"destination": "/workspace", "type": "bind", "source": os.path.join(fs, "work"),
         "options": ["rbind", "rw", "nosuid", "nodev"]},
        {"destination": "/tmp", "type": "bind", "source": os.path.join(fs, "tmp"),
         "options": ["rbind", "rw", "nosuid", "nodev"]},
        {"destination": "/dev/shm", "type": "bind", "source": os.path.join(fs, "shm"),
         "options": ["rbind", "rw", "nosuid", "nodev"]},
    ]
    if os.path.isdir(os.path.join(src, "etc/alternatives")):
        mnts.insert(3, {"destination": "/etc/alternatives", "type": "bind",
                        "source": os.path.join(src, "etc/alternatives"), "options": ro})
    if src != "/":  # an image: its /opt, /srv, /var too, as the namespace tier binds them
        from trialbox.sandbox.image_root import EXTRA_TOPS
        for top in EXTRA_TOPS:
            if os.path.isdir(os.path.join(src, top)):
                mnts.append({"destination": "/" + top, "type": "bind",
                             "source": os.path.join(src, top), "options": ro})
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        host = os.path.join(src, top.lstrip("/"))
        if os.path.isdir(host) and not os.path.islink(host):
            mnts.append({"destination": top, "type": "bind", "source": host, "options": ro})
    if engine.name != "runsc":  # runsc makes its own /dev nodes
        for n in DEV_NODES:
            mnts.append({"destination": f"/dev/{n}", "type": "bind", "source": f"/dev/{n}",
                         "options": ["bind", "nosuid", "noexec"]})
    caps = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL"]
    if engine.recycle:  # the fork server's own (forkserver.SERVER_CAPS): a run's IPC
        # namespace, emptying the files between attempts; every run drops them all
        caps += ["CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_ADMIN", "CAP_SETPCAP"]
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    if engine.name != "runsc":  # gVisor shows no host cgroup (its own /proc)
        namespaces.append({"type": "cgroup"})  # the session's cgroup reads as "/"
    if not limits.network:
        namespaces.append({"type": "network"})
    linux: dict[str, Any] = {"namespaces": namespaces,
                             # what would name the host (its kernel command line, its
                             # boot), empty as in the namespace tier's cells
                             "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list",
                                             "/proc/sched_debug", "/sys/firmware",
                                             "/proc/scsi", "/proc/cmdline",
                                             "/proc/sys/kernel/random/boot_id"],
                             "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger",
                                               "/proc/irq", "/proc/bus"]}
    if engine.userns:
        namespaces.append({"type": "user", **({"path": userns} if userns else {})})
        linux["uidMappings"] = [{"containerID": 0, "hostID": uid_base, "size": 65536}]
        linux["gidMappings"] = [{"containerID": 0, "hostID": uid_base, "size": 65536}]
    if cgroup is not None:
        linux["cgroupsPath"] = "/" + cgroup
    return {
        "ociVersion": "1.0.2",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": [python, "-I", "-B", "/.tb/forkserver.py"],
            "env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", f"TB_CTL_FD={engine.ctl_fd}"],
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": True,
            # joining a user namespace, runc cannot raise a limit (EPERM): the runtime
            # process is given it instead (Container._start)
            "rlimits": [] if userns else [{"type": "RLIMIT_NOFILE", "hard": FORKSERVER_NOFILE,
                                           "soft": FORKSERVER_NOFILE}],
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

    def __init__(self, provider: OciProvider, sid: str, sdir: str, limits: Limits,
                 uid_base: int = 0, views: str = ""):
        self.provider, self.sid, self.sdir, self.limits = provider, sid, sdir, limits
        self.views = views
        """The session's /proc view files (procview.py), bound over /proc/meminfo and
        the rest; empty: the kernel's own (gVisor's)."""
        self.uid_base = uid_base
        """Host uid of the container's uid 0 (its session's block: uids.py)."""
        self.cid = f"{provider.id}-{sid}"
        self.cgroup = f"trialbox-oci/{provider.id}/{sid}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctl: socket.socket | None = None
        """Our end of the fork server's stdin (frames to it, with fds)."""
        self.chan: _Channel | None = None
        self.files: CellFiles | None = None
        self.hello: asyncio.Future[None] = provider.loop.create_future()
        self.hello.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.on_frame: Callable[[bytes, bytes], None] | None = None
        self.on_eof: Callable[[], None] | None = None
        self.dead = False
        self.gate: Gate | None = None
        """The container's allow-listed way out (network.py), with Limits.net_allow."""
        self.netns = -1  # the network namespace made for the gate (held until destroy)
        self.refused = 0  # the gate's final count, once destroyed

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        p = self.provider
        userns = -1
        if p.engine.userns:  # owned by the session's own uid, not host root (userns.py)
            userns, netns = await p.loop.run_in_executor(
                None, make_userns, self.uid_base, self.uid_base, MAPPED,
                bool(self.limits.net_allow))
            if netns >= 0:  # the gate's namespace must be the user namespace's own
                self.netns = netns
        try:
            await self._start(userns)
        finally:
            if userns >= 0:  # joined by the container (or it failed): ours is not needed
                os.close(userns)

    async def _start(self, userns: int) -> None:
        p = self.provider
        fs = os.path.join(self.sdir, "fs")
        config = bundle_config(p.engine, p.rootfs, p.tb_dir, fs, p.config.python,
                               self.limits, None if p.engine.join_cgroup else self.cgroup,
                               self.uid_base, p.image_src,
                               f"/proc/{os.getpid()}/fd/{userns}" if userns >= 0 else "",
                               self.views)
        with open(os.path.join(self.sdir, "config.json"), "w") as f:
            json.dump(config, f)
        if self.limits.net_allow:
            await self._attach_gate(config)
            with open(os.path.join(self.sdir, "config.json"), "w") as f:
                json.dump(config, f)
        procs = p.cgroups.create(self.cgroup, p.host_limits(self.limits))
        self.files = p.cgroups.open_files(self.cgroup)
        join = procs if p.engine.join_cgroup else []

        # The fork server's control channel is a unix socket, so fds can travel with a
        # run (SCM_RIGHTS: `pass_fds`; gVisor imports them as host fds).
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs_fd, ctl_fd = theirs.fileno(), p.engine.ctl_fd
        trees = readonly_trees(config) if p.engine.own_views else []

        def enter() -> None:  # in the child, before exec
            for path in join:  # into the session's cgroup
                with open(path, "w") as fh:
                    fh.write("0")
            os.setsid()
            if p.engine.own_views:
                private_views(p.dev_dir, trees, p.empty_dir)
            if userns >= 0:
                resource.setrlimit(resource.RLIMIT_NOFILE,
                                   (FORKSERVER_NOFILE, FORKSERVER_NOFILE))
            if ctl_fd != 0:
                os.dup2(theirs_fd, ctl_fd)

        extra = ("--preserve-fds", "1") if ctl_fd != 0 else ()
        argv = p.engine.argv(p.runtime_root, "run", *extra, "--bundle", self.sdir,
                             self.cid)
        if self.limits.network:  # runsc: the host's network (others: no netns in the spec)
            argv = [("--network=host" if a == "--network=none" else a) for a in argv]
        elif self.limits.net_allow:
            # runsc: the Sentry's sockets are host sockets in the namespace the bundle
            # names (ours, whose only way out is the gate). Its own netstack
            # (--network=sandbox) is refused there: this runsc takes any namespace with
            # /proc/sys/net/core/rmem_default for the host's, and kernels since 6.x
            # have that file in every namespace.
            argv = [("--network=host" if a == "--network=none" else a) for a in argv]
        logf = open(os.path.join(self.sdir, "runtime.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=theirs_fd if ctl_fd == 0 else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=logf, preexec_fn=enter, close_fds=True,
                pass_fds=(ctl_fd,) if ctl_fd != 0 else (), cwd=self.sdir,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
        except BaseException:
            ctl.close()
            raise
        finally:
            theirs.close()
            logf.close()
        self.ctl = ctl
        assert self.proc.stdout is not None
        fd = os.dup(self.proc.stdout.fileno())
        self.proc.stdout.close()
        self.chan = _Channel(p.loop, fd, self._frame, self._eof)
        try:
            await asyncio.wait_for(asyncio.shield(self.hello), p.config.start_timeout_s)
        except BaseException:
            self.destroy()
            raise

    async def _attach_gate(self, config: dict[str, Any]) -> None:
        """A network namespace of our own for the container, with a gate (network.py)
        to what `Limits.net_allow` allows; the bundle joins it by path."""
        loop = self.provider.loop
        if self.netns < 0:  # else made with the container's user namespace (userns.py)
            self.netns = await loop.run_in_executor(None, new_netns)
        await loop.run_in_executor(None, configure_sandbox_side, self.netns)
        self.gate = await loop.run_in_executor(None, Gate.open, self.limits.net_allow,
                                               self.netns, self.provider.config.net_egress)
        self.gate.serve(loop)
        path = f"/proc/{os.getpid()}/fd/{self.netns}"
        for ns in config["linux"]["namespaces"]:
            if ns["type"] == "network":
                ns["path"] = path

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

    def send(self, *frames: tuple[bytes, bytes], fds: Sequence[int] = ()) -> None:
        """Frames (tag, payload) to the fork server, in one write; `fds` ride with its
        first byte."""
        if self.ctl is None or self.dead:
            raise SandboxStartError("the session's container is gone")
        data = b"".join(HEADER.pack(tag, len(payload)) + payload for tag, payload in frames)
        sent = socket.send_fds(self.ctl, [data], list(fds)) if fds else 0
        if sent < len(data):
            self.ctl.sendall(data[sent:])

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
            if self.ctl is not None:
                self.ctl.close()  # EOF: the fork server kills all and exits
                self.ctl = None
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
        if self.gate is not None:
            self.refused = self.gate.close()
            self.gate = None
        if self.netns >= 0:
            os.close(self.netns)
            self.netns = -1


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
        self.dev_dir = os.path.join(self.dir, "dev")
        """A small tmpfs of device nodes, seen through an overlay of each container's own
        (`private_views`) from which runc/crun bind them into its /dev: the host's
        devtmpfs, sized to the host's memory, is not named."""
        self.empty_dir = os.path.join(self.dir, "empty")
        """An empty directory: the second layer of the containers' overlays."""
        self.views_dir = os.path.join(self.dir, "proc")
        """A tmpfs of the sessions' /proc view files (procview.py), a directory each."""
        self.runtime_root = os.path.join(self.dir, "runtime")
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.cgroups: CgroupDriver = None  # type: ignore[assignment]
        self.runtime: Runtime = None  # type: ignore[assignment]
        self.env: dict[str, str] = dict(BASE_ENV)
        """What every run's environment starts from: BASE_ENV and an image's [env]."""
        self.reaped: dict[str, int] = {}
        self.python_names: frozenset[str] = frozenset()
        self._seq = 0
        self._ready: list[OciSession] = []
        self._warming = 0
        self._changed = asyncio.Event()  # a warm-up finished (ready, or failed)
        self._tasks: set[asyncio.Task[None]] = set()
        self._lent: dict[str, asyncio.TimerHandle] = {}
        self.recycled = 0
        """Sessions reset and kept warm for the next `open()` (Engine.recycle)."""
        self.closed = False
        self.started = False
        self.image_guard: ImageGuard | None = None
        """Verifies `OciConfig.image` (image_verify.py); None without an image."""
        self.image_src = "/"
        """Where the containers' /usr comes from: the image's rootfs, or the host's."""
        self.preloaded_modules = frozenset(n for n, _src in self.config.preload_sources)
        """base.preloaded_modules: the sources the fork server imports into every run."""

    def host_limits(self, limits: Limits) -> Limits:
        """What the session's host cgroup enforces for a run with `limits` (on top of
        what the sandbox holds when the run starts)."""
        return limits.with_(pids=limits.pids + 1)  # the fork server

    def run_rlimits(self, limits: Limits) -> dict[str, list[int]]:
        cpu = int(limits.cpu_s * 2) + 5  # a backstop; the cgroup's total is the limit
        return {"RLIMIT_NOFILE": [limits.open_files, limits.open_files],
                "RLIMIT_CPU": [cpu, cpu + 1], "RLIMIT_CORE": [0, 0],
                "RLIMIT_FSIZE": [limits.disk_bytes, limits.disk_bytes]}

    def _check_userns(self) -> None:
        """SandboxUnavailable unless an unprivileged uid may make the user namespace a
        container session joins (userns.py): never a container owned by host root."""
        if not os.access(UNSHARE, os.X_OK):
            raise SandboxUnavailable(f"the {self.tier} tier needs {UNSHARE}; install it: "
                                     "apt-get install util-linux")
        with self.lease_uids() as uids:
            try:
                user, _ = make_userns(uids.first, uids.first)
            except SandboxStartError as e:
                raise SandboxUnavailable(
                    f"the {self.tier} tier gives each session a user namespace owned by "
                    f"an unprivileged uid, and this node refuses one ({e}); allow "
                    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone"
                    "=1, user.max_user_namespaces > 0)") from e
            os.close(user)

    def lease_uids(self) -> UidLease:
        """Host uids of its own for one container session: a block of the node's grid
        (uids.py), for the container's 0..65535 (userns.py)."""
        return lease(MAPPED)

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
        if self.engine.userns:
            self._check_userns()
        self.cgroups = CgroupDriver.detect()
        if self.config.image:
            from trialbox.sandbox.image import load_image
            from trialbox.sandbox.image_root import image_runtime
            from trialbox.sandbox.image_verify import ImageGuard
            image = load_image(self.config.image)
            self.image_guard = ImageGuard(image)
            self.image_guard.start()  # watch, then hash: ImageMismatch, no start
            self.runtime = image_runtime(image)
            self.image_src = image.rootfs
            self.env = {**BASE_ENV, **dict(image.env)}  # what every run starts from
        else:
            self.runtime = system_runtime(self.config.python)
        self.python_names = frozenset({"python", "python3", self.config.python,
                                       os.path.realpath(self.config.python)})
        self.reaped = reap_orphans(self.config.state_dir)
        if any(self.reaped.values()):
            log.warning("reaped what dead %s supervisors left: %s", self.tier, self.reaped)
        for d in (self.dir, self.tb_dir, self.rootfs, self.runtime_root,
                  os.path.join(self.dir, "s")):
            os.makedirs(d, exist_ok=True)
        os.chmod(self.dir, 0o711 if self.engine.userns else 0o700)
        # The root skeleton and /.tb on tmpfs of their own: a container's mountinfo then
        # shows "/" as their root, not the host path with this provider's owner id.
        mounts.mount_tmpfs(self.rootfs, 64 << 20, mode=0o755)
        mounts.mount_tmpfs(self.tb_dir, 16 << 20, mode=0o755)
        if self.engine.own_views:
            make_dev_dir(self.dev_dir)
            os.makedirs(self.empty_dir, mode=0o755, exist_ok=True)
        if self.engine.proc_views:
            # its own filesystem: a container's mountinfo shows /<session's dir>/meminfo
            os.makedirs(self.views_dir, exist_ok=True)
            mounts.mount_tmpfs(self.views_dir, 64 << 20, mode=0o755)
        with open(os.path.join(self.dir, "engine"), "w") as f:
            f.write(" ".join(self.engine.argv(self.runtime_root)))
        if self.image_guard is not None:
            from trialbox.sandbox.image_root import prepare_template
            prepare_template(self.image_guard.image, self.rootfs)
        build_rootfs(self.rootfs, self.image_src)
        shutil.copyfile(FORKSERVER, os.path.join(self.tb_dir, "forkserver.py"))
        with open(os.path.join(self.tb_dir, "preload.json"), "w") as f:
            json.dump({"modules": self.config.preload,
                       "sources": [list(x) for x in self.config.preload_sources]}, f)
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
        if self.image_guard is not None:  # the image's cheap check (image_verify.py)
            await self.image_guard.before_task()
        if limits.net_allow:
            check_node()
        warm_fits = not limits.network and not limits.net_allow
        if warm_fits and not self._ready and self._warming:
            await self._wait_for_warm()  # no second cold start beside one under way
        while warm_fits and self._ready:
            sb = self._ready.pop()
            if sb.container is not None and sb.container.alive:
                try:
                    sb.reshape(limits)
                except SandboxStartError as e:
                    log.warning("a warm %s session could not be resized: %s", self.tier, e)
                    sb.container.dead = True  # not kept: close() destroys it
                else:
                    self._lend(sb)
                    self._refill()
                    return sb
            await sb.close()
        sb = await self._new_session(limits)
        self._lend(sb)
        self._refill()
        return sb

    # -- recycling (Engine.recycle) ----------------------------------------------------
    def _recyclable(self, limits: Limits) -> bool:
        return self.engine.recycle and not limits.network and not limits.net_allow

    def _lend(self, sb: OciSession) -> None:
        """A recyclable session goes out: count it toward the warm target for
        LEND_GRACE_S (it is expected back), so its return, not a cold start, refills."""
        if self._recyclable(sb.limits):
            self._lent[sb.sid] = self.loop.call_later(LEND_GRACE_S, self._lend_expired,
                                                      sb.sid)

    def _lend_expired(self, sid: str) -> None:
        self._lent.pop(sid, None)
        self._refill()

    def returned(self, sid: str) -> None:
        """A session handed out is closed (recycled or destroyed): stop counting it."""
        handle = self._lent.pop(sid, None)
        if handle is not None:
            handle.cancel()
        self._refill()

    async def recycle(self, sb: OciSession, c: Container) -> OciSession | None:
        """Reset the closed session `sb`'s container for the next attempt and keep it
        warm: the fork server checks that no process is alive but itself and the next
        run's waiting child (every run's processes are killed when it ends; each run
        had an IPC namespace of its own, gone with them) and empties the workspace,
        /tmp and /dev/shm from inside; the host side checks they are empty and hold no
        space (OciSession.wipe). Returns the fresh session now among
        the warm ones (a new object: `sb` stays closed), or None when the container is
        not fit to keep (dead, network, a failed reset, the warm pool full): the caller
        destroys it."""
        if (not self._recyclable(sb.limits) or self.closed or not c.alive
                or len(self._ready) >= self.config.warm):
            return None
        if not await self._reset(c):
            return None
        try:
            await self.loop.run_in_executor(None, sb.wipe)
        except OSError as e:
            log.warning("could not empty a %s session's files for reuse: %s", self.tier, e)
            return None
        if self.closed or not c.alive or len(self._ready) >= self.config.warm:
            return None
        from trialbox.sandbox.ocisession import OciSession
        fresh = OciSession(self, sb.sid, sb.limits)
        fresh.container = c
        self._ready.append(fresh)
        self.recycled += 1
        self._changed.set()
        return fresh

    async def _reset(self, c: Container) -> bool:
        done: asyncio.Future[bytes] = self.loop.create_future()

        def frame(tag: bytes, payload: bytes) -> None:
            if tag == b"N" and not done.done():
                done.set_result(payload)

        def eof() -> None:
            if not done.done():
                done.set_exception(SandboxStartError("the fork server exited"))

        c.on_frame, c.on_eof = frame, eof
        try:
            c.send((b"N", b""))
            reply = json.loads(await asyncio.wait_for(done, STOP_GRACE_S))
        except (OSError, SandboxStartError, TimeoutError, ValueError) as e:
            log.warning("could not reset a %s session for reuse: %s", self.tier, e)
            c.dead = True
            return False
        finally:
            c.on_frame = c.on_eof = None
        if reply.get("error"):
            log.warning("could not reset a %s session for reuse: %s", self.tier,
                        reply["error"])
            c.dead = True
            return False
        return True

    async def _wait_for_warm(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        while not self._ready and self._warming and not self.closed:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                return

    async def _new_session(self, limits: Limits) -> OciSession:
        from trialbox.sandbox.ocisession import OciSession
        self._seq += 1
        sb = OciSession(self, f"s{self._seq}", limits)
        try:
            # off the loop: a tmpfs mount and, on the container tier, the uid lease
            # (uids.py may read /proc); a cancelled caller still waits for it, so
            # close() below undoes all of it
            made = self.loop.run_in_executor(None, sb.make_workspace)
            try:
                await asyncio.shield(made)
            except asyncio.CancelledError:
                await asyncio.wait([made])
                raise
            await sb.start_container()
        except BaseException:
            await sb.close()
            raise
        return sb

    def _refill(self) -> None:
        if self.closed or not self.started:
            return
        while len(self._ready) + self._warming + len(self._lent) < self.config.warm:
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
            self._changed.set()
        if self.closed:
            await sb.close()
        else:
            self._ready.append(sb)
            self._changed.set()

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
        if self.image_guard is not None:
            self.image_guard.close()
        for handle in self._lent.values():
            handle.cancel()
        self._lent.clear()
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
        if self.image_guard is not None:
            self.image_guard.close()
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
        if not clear_cgroup(rel):
            log.warning("cgroup %s still busy", rel)


def cgroup_roots() -> list[str]:
    """Every cgroup hierarchy's mount point: runc and crun create a container's cgroup in
    all of them (blkio, devices, freezer, the named systemd one, cgroup2...), not only in
    the four whose limits and accounting trialbox uses."""
    return sorted({mp for mp, _fstype, _opts in _cgroup_mounts()})


def _cgroup_procs(path: str) -> list[int]:
    found: list[int] = []
    for dirpath, _dirs, _files in os.walk(path):
        try:
            with open(os.path.join(dirpath, "cgroup.procs")) as f:
                found += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return found


def _rmdir_tree(path: str) -> bool:
    ok = True
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda w: -w[0].count("/")):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    return ok


def clear_cgroup(rel: str) -> bool:
    """Kill every process under `rel` in every hierarchy, then remove `rel` and all below
    it everywhere. False if something was still busy."""
    paths = [os.path.join(root, rel) for root in cgroup_roots()]
    for _ in range(100):
        pids = {p for path in paths for p in _cgroup_procs(path)}
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    return all([_rmdir_tree(path) for path in paths])


def reap_orphans(state_dir: str) -> dict[str, int]:
    """Remove what dead OCI-tier supervisors left: their containers (each runtime's
    `delete --force`), processes in their cgroups, the cgroups, mounts, directories."""
    counts = {"containers": 0, "processes": 0, "cgroups": 0, "mounts": 0}
    if os.path.isdir(state_dir):
        for name in os.listdir(state_dir):
            if owner_alive(name):
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
    dead = set()
    for root in cgroup_roots():
        top = os.path.join(root, "trialbox-oci")
        if os.path.isdir(top):
            dead |= {name for name in os.listdir(top)
                     if os.path.isdir(os.path.join(top, name)) and not owner_alive(name)}
    for name in sorted(dead):
        rel = f"trialbox-oci/{name}"
        counts["processes"] += len({p for root in cgroup_roots()
                                    for p in _cgroup_procs(os.path.join(root, rel))})
        if clear_cgroup(rel):
            counts["cgroups"] += 1
    return counts
