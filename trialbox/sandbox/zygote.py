"""The warm zygote: a fork server run as `/usr/bin/python3 -I zygote.py` (the sandbox's
own interpreter, never the project's venv), started by `trialbox.sandbox.zygote_client`.

This file is deliberately standalone: it imports nothing from trialbox and holds no
secrets and none of the project's state (its environment is cleared, its only open fd
besides stdio is the control socket). The supervisor sends it a config once, then asks
it to *warm* cells and to *kill* them.

A cell is one session's sandbox: fresh namespaces, its own cgroup, the read-only root
built, prepared before anyone asks for it, and alive until the session closes:

    zygote (root, host namespaces)
      └─ B  pid 1 of a new pid namespace (forked straight into it): unshares mount/ipc/
          │  uts/net namespaces, builds the read-only root (binds of the declared
          │  runtime, /dev nodes, /proc) and pivots into it. With a session's first `go`
          │  it attaches the session's workspace, /tmp and /dev/shm (detached mount trees
          │  the supervisor cloned with open_tree). It forwards each `go` to the waiting C, obeys
          │  `stop`, and when C exits kills every other process of the namespace
          │  (kill(-1) from pid 1), reaps, reports C's status, forks the next C.
          └─ C  the next candidate, forked ahead of time: joins the cell's cgroups and
                waits for its `go`.

On `go` C drops to the session's unprivileged uid, enters a fresh user namespace (uid
1000 inside), drops every capability, sets rlimits and no_new_privs, loads the seccomp
filter, says started, and then either execs the command or — for Python scripts — runs
the script in this already-initialised interpreter, which is what makes a run start in
about a millisecond instead of ten. Every process of a run is dead before its status is
reported; nothing but the session's files carries over to the next run, and nothing at
all to the next session (new cell, new namespaces, new tmpfs).

Where the pool built it (gcc; `PoolConfig.native`), B's loop after its root is built and
C's way from its fork to `S` run in C instead — cell.c, the same steps with the same
system calls, called through ctypes (`cell_loop_native`): in Python each of those steps
wrote to heap pages B shares with C, a copy-on-write fault each. The Python below is
the fallback, and tested as much.

The status pipe (one per cell, read by the supervisor) carries one-byte records:
`R` ready, `S` started (all isolation applied; nothing before it is the candidate's),
`X` + int32 wait status of C (written by B), `E` + text when setting up failed.
"""

from __future__ import annotations  # annotations are never evaluated: no cost at run time

import array
import atexit
import builtins
import ctypes
import errno
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import types

# typing is not imported at run time (the system python's start-up does not load it, and
# every module loaded here is in every candidate's interpreter): the names below exist
# only for the type checker, which treats TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # the same functions as _signal, which has no stub
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, Literal, NoReturn, TypedDict

    Message = dict[str, Any]
    """One JSON message from the supervisor on the control socket (pool.send_zygote),
    by its `op`: "config" (the first: see Config); "warm" (keys cell, net, proc; fds:
    the status socket, the session socket, the cell's cgroup files); "netns" (key cell;
    fd: the socket to answer on); "kill" (key cell)."""

    Child = tuple[int, int, socket.socket]
    """A candidate forked ahead (spawn_candidate): its pid, its pidfd, and B's end of
    the socket its `go` comes on."""

    class Config(TypedDict, total=False):
        """The zygote's `config` message (zygote_client.cell_config), kept as CONFIG.
        Every key but zygote_usr is always sent; B drops the host paths (root, ro_binds,
        dev, empty, native) once its root is built (cell_init)."""
        op: str
        root: str  # the template directory that becomes each cell's `/`
        ro_binds: list[list[str]]  # [source, target] of each read-only view of the runtime
        dev: str  # the lower layer of each cell's /dev
        empty: str  # an empty directory: the overlays' second layer
        hostname: str
        seccomp: str  # the filter program, hex
        preload: list[str]  # modules imported once (prewarm)
        preload_sources: list[list[str]]  # [name, source] of helper modules (prewarm)
        env: dict[str, str]  # the runs' usual environment
        mounts: list[str]  # where a session's work/, tmp/ and shm/ trees are attached
        native: str | None  # cell.c's shared object, or None for the Python path
        zygote_usr: bool  # we run from an overlay of /usr (set_exe)
else:
    import _signal

# Private references: the candidate runs in this interpreter and may delete or replace
# os._exit & co.; sabotaging them must not send a child back into zygote code.
_exit = os._exit
_write = os.write

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong]
libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
PR_SET_MM, PR_SET_MM_EXE_FILE, PR_SET_MM_MAP = 35, 13, 14
SECCOMP_MODE_FILTER = 2
SYS_PIVOT_ROOT, SYS_CAPSET, SYS_MOVE_MOUNT = 155, 126, 429
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100
SIGINT = int(signal.SIGINT)
MAX_FDS = 3 + 61 + 3  # stdio, pass_fds targets 3..63, a session's three mount trees
INNER_UID = 1000
NEXT_RUN_GRACE_S = 0.01
MASKED_PROC = ("/proc/cmdline", "/proc/sys/kernel/random/boot_id")

CONFIG: Config = {}
# what os.environ holds (set_environ), so a run can tell it needs nothing
ENVIRON: dict[str, str] = {}
# capset(2) arguments (version 3, this process; no capability at all), made once
CAPSET_HEADER = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0), 8)
CAPSET_NONE = ctypes.create_string_buffer(bytes(24), 24)
ZYGOTE_PID = os.getpid()
PIDNS_FD = -1  # our own pid namespace, to return to after each cell's fork
# (buffer, sock_fprog) kept alive for the process's life
SECCOMP_PROG: tuple[ctypes.Array[ctypes.c_char], SockFprog] | None = None
CELLS: dict[str, int] = {}  # cell id -> pid of A
# cell.c's hot path (B's loop, C's set-up), when the pool built it
NATIVE: ctypes.CDLL | None = None
NATIVE_BUF: memoryview | None = None  # its message buffer, as a memoryview
TB_CHILD, TB_EOF = 1, 3  # tb_cell's returns
R_STATUS, R_OFF, R_LEN, R_ERRNO, R_STEP = range(5)  # its results


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return ret


def mount(src: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    enc: Callable[[str | None], bytes | None] = (
        lambda s: s.encode() if isinstance(s, str) else s)
    _check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)),
           "mount %s on %s" % (src, target))


def prctl(option: int, arg2: int = 0) -> None:
    _check(libc.prctl(option, arg2, 0, 0, 0), "prctl %d" % option)


def recv_raw(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message's bytes and the fds passed with it; (b"", []) at end of stream."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(
        1 << 20, socket.CMSG_SPACE(MAX_FDS * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(cdata[:len(cdata) - (len(cdata) % fds.itemsize)])
    if not data:
        for fd in fds:
            os.close(fd)
        return b"", []
    return data, list(fds)


def recv_msg(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message as JSON decodes it, unchecked (a Message; the first is the Config),
    and the fds passed with it; (None, []) at end of stream."""
    data, fds = recv_raw(sock)
    return (json.loads(data) if data else None), fds


def report(fd: int, tag: bytes, payload: bytes = b"") -> None:
    try:
        _write(fd, tag + payload)
    except OSError:
        pass


def report_error(fd: int, text: str) -> None:
    """`E` + uint16 length + text: framed, so the records after it can still be read."""
    data = text.encode(errors="replace")[:400]
    report(fd, b"E", struct.pack("<H", len(data)) + data)


# --------------------------------------------------------------------------- zygote

def reap(_signum: int | None = None, _frame: types.FrameType | None = None) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for cell, apid in list(CELLS.items()):
            if apid == pid:
                del CELLS[cell]


def serve(ctl: socket.socket) -> None:
    global SECCOMP_PROG, PIDNS_FD
    PIDNS_FD = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    msg, fds = recv_msg(ctl)
    if msg is None or msg.get("op") != "config":
        sys.exit(2)
    CONFIG.update(msg)
    # The runs' usual environment, set once here: a candidate whose run asks for
    # exactly this one (most do) inherits it instead of rebuilding os.environ.
    set_environ(CONFIG.get("env") or {})
    prog = bytes.fromhex(CONFIG["seccomp"])
    buf = ctypes.create_string_buffer(prog, len(prog))
    SECCOMP_PROG = (buf, SockFprog(len(prog) // 8, ctypes.addressof(buf)))
    signal.signal(signal.SIGCHLD, reap)
    load_native(CONFIG.get("native"))
    if CONFIG.get("zygote_usr"):
        # Can a cell swap its /proc/self/exe (set_exe)? Tried here on our own file, a
        # no-op when it works; where the kernel refuses, cells keep the zygote's.
        try:
            set_exe(os.readlink("/proc/self/exe"))
        except OSError as e:
            CONFIG["zygote_usr"] = False
            sys.stderr.write("cells keep the zygote's executable: %s\n" % e)
    prewarm(CONFIG.get("preload", ()), CONFIG.get("preload_sources", ()))
    # Pre-fork server discipline: freeze every object that exists now into the permanent
    # generation and keep the collector off, so no collection in a forked child walks
    # (and so copies, page by page) the inherited heap. The candidate gets gc back on.
    # Cyclic garbage from the imports is collected and glibc's free pages go back to the
    # kernel first: every cell and candidate is forked from this heap, and each mapped
    # page costs a page-table entry copied at the fork and torn down at exit (~0.7 MiB
    # of 8.6 here).
    gc.disable()
    gc.collect()
    gc.freeze()
    libc.malloc_trim(0)
    ctl.sendmsg([json.dumps({"op": "hello", "pid": os.getpid(), "native": NATIVE is not None,
                             "own_exe": bool(CONFIG.get("zygote_usr")),
                             "python": sys.version.split()[0]}).encode()])
    while True:
        msg, fds = recv_msg(ctl)
        if msg is None:
            break
        op = msg.get("op")
        if op == "warm":
            warm(ctl, msg, fds)
        elif op == "netns":  # the cell's network namespace, for its allow-list gate
            send_netns(CELLS.get(msg["cell"]), fds)
        elif op == "kill":
            pid = CELLS.get(msg["cell"])
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
    for pid in list(CELLS.values()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def send_netns(pid: int | None, fds: list[int]) -> None:
    """Answer on the socket passed (fds[0]): `N` with an fd of B's network namespace
    (the supervisor attaches a network gate to it: sandbox/network.py), or `E`."""
    if not fds:
        return
    reply = socket.socket(fileno=os.dup(fds[0]))
    try:
        ns = os.open("/proc/%d/ns/net" % pid, os.O_RDONLY | os.O_CLOEXEC) if pid else -1
    except OSError:
        ns = -1
    try:
        if ns >= 0:
            socket.send_fds(reply, [b"N"], [ns])
        else:
            reply.sendmsg([b"E"])
    except OSError:
        pass
    finally:
        reply.close()
        if ns >= 0:
            os.close(ns)


WARMUP_SOURCE = """
import sys
def f(a, *b, c=1, **d):
    return [x * 2 for x in range(a) if x % 2] + list({k: v for k, v in d.items()})
class K(object):
    def __init__(self, v): self.v = v
try:
    f(3, c=2)
except (ValueError, KeyError) as e:
    raise RuntimeError(str(e)) from e
finally:
    pass
while False:
    break
lambda x: (yield x)
print(f"{1:>3} {'s'!r}", end="")
"""


def load_native(path: str | None) -> None:
    """Load cell.c's shared object (built by the pool; None: the Python path below)."""
    global NATIVE, NATIVE_BUF
    if not path:
        return
    try:
        # Loaded from a memfd, so /proc/self/maps of a candidate (which runs in this
        # interpreter) shows "/memfd:cell.so", not the pool's state directory.
        with open(path, "rb") as f:
            data = f.read()
        fd = os.memfd_create("cell.so", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            lib = ctypes.CDLL("/proc/self/fd/%d" % fd)
        finally:
            os.close(fd)
    except OSError as e:  # the pool falls back to Python, or fails if it asked for C
        sys.stderr.write("zygote: cannot load %s: %s\n" % (path, e))
        sys.stderr.flush()
        return
    lib.tb_cell.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.tb_cell.restype = ctypes.c_int
    lib.tb_buffer.restype = ctypes.c_void_p
    lib.tb_buffer_size.restype = ctypes.c_long
    lib.tb_step.argtypes = [ctypes.c_long]
    lib.tb_step.restype = ctypes.c_char_p
    NATIVE = lib
    NATIVE_BUF = memoryview((ctypes.c_char * lib.tb_buffer_size()).from_address(
        lib.tb_buffer()))


def prewarm(modules: Iterable[str], sources: Iterable[Sequence[str]] = ()) -> None:
    """Do once, here, what every child would otherwise do cold: the first compile() in
    a process costs ~2 ms (parser tables), the first import of common modules more.
    `sources` are (name, code) of standalone helper modules the pool's user wants
    importable at no cost (e.g. the judge's codec); they are not secret."""
    compile(WARMUP_SOURCE, "<warmup>", "exec")
    json.loads(json.dumps({"a": [1, "b", None, 1.5, True]}))
    for name in modules:
        try:
            __import__(name)
        except Exception:
            pass
    for name, source in sources:
        module = types.ModuleType(name)
        module.__file__ = "<%s>" % name
        sys.modules[name] = module
        try:
            exec(compile(source, module.__file__, "exec"), module.__dict__)
        except Exception:
            del sys.modules[name]


def warm(ctl: socket.socket, msg: Message, fds: list[int]) -> None:
    """Fork B straight into a new pid namespace (so B is its pid 1): unshare(NEWPID)
    only changes the namespace of our *next* child; setns puts us back after the fork.
    One fork per cell instead of a monitor process in between."""
    if len(fds) < 2:
        return
    status_w = fds[0]
    _check(libc.unshare(CLONE_NEWPID), "unshare pid")
    try:
        pid = os.fork()
    except OSError as e:
        report_error(status_w, "zygote fork failed: %s" % e)
        return
    finally:
        if os.getpid() == ZYGOTE_PID:
            _check(libc.setns(PIDNS_FD, CLONE_NEWPID), "setns back to our pid namespace")
    if pid == 0:
        code = 0
        CELLS.clear()  # the zygote's other cells are none of this one's business
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            ctl.close()
            os.close(PIDNS_FD)
            cell_init(msg, fds[0], fds[1], fds[2:])
        except BaseException as e:  # report everything: this is infrastructure
            report_error(status_w, "cell setup (B): %r" % (e,))
            code = 70
        _exit(code)
    CELLS[msg["cell"]] = pid


# --------------------------------------------------- B: pid 1 of the cell's namespace

def overlay(lower: str, target: str, flags: int) -> None:
    """A read-only overlay of `lower` at `target` (an empty directory as its second
    layer: overlayfs wants two without an upper). Its inodes are this cell's own, not
    the host's nor another cell's: inotify, flock and OFD locks on them reach no one
    else (docs/adversary.md, K). The layers are named by /proc/self/fd paths, so the
    cell's mountinfo shows no host path."""
    fds = [os.open(lower, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
           os.open(CONFIG["empty"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        mount("overlay", target, "overlay", flags,
              "lowerdir=/proc/self/fd/%d:/proc/self/fd/%d" % tuple(fds))
    finally:
        for fd in fds:
            os.close(fd)


def build_root(net: bool, view: str = "") -> None:
    root = CONFIG["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # The zygote runs from an overlay of /usr (so that its executable, which every
    # Python candidate's /proc/self/exe names, can be swapped for this cell's: set_exe);
    # this cell builds its own views from the real /usr beneath it.
    if "zygote_usr" in CONFIG:  # even where set_exe is refused: no nested overlays
        _check(libc.umount2(b"/usr", MNT_DETACH), "umount the zygote's /usr")
    ro = MS_RDONLY | MS_NOSUID | MS_NODEV
    overlay(root, root, ro)
    for src, dst in CONFIG["ro_binds"]:
        overlay(src, root + dst, ro)
    overlay(CONFIG["dev"], root + "/dev", MS_RDONLY | MS_NOSUID)  # its nodes must open
    # hidepid=2: the candidate (another uid) cannot see its init or read its argv/env.
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    # Host facts a sandbox has no use for, and that would tell sessions apart or name
    # the machine: read as empty (/dev/null bound over them).
    for path in MASKED_PROC:
        mount(root + "/dev/null", root + path, None, MS_BIND)
    # The machine-wide figures (/proc/meminfo, /proc/stat, /proc/loadavg, /proc/cpuinfo:
    # the files in `view`) as this cell's limits say them: files of its own that the
    # pool rewrites when a run's limits change (procview.py). Owned by host root, which
    # no uid of the cell maps to: nobody in it can write them.
    for name in sorted(os.listdir(view)) if view else ():
        mount(view + "/" + name, root + "/proc/" + name, None, MS_BIND)
    host = CONFIG.get("hostname", "sandbox").encode()
    _check(libc.sethostname(host, len(host)), "sethostname")
    if not net:
        loopback_up()
    exe = os.readlink("/proc/self/exe")
    os.chdir(root)
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if CONFIG.get("zygote_usr"):
        set_exe(exe)


def set_exe(path: str) -> None:
    """Make this cell's copy of the interpreter (`path` in its own /usr overlay) our
    /proc/self/exe, and so every candidate's that runs in this interpreter (they fork
    from us). Else it is the zygote's file, shared by every cell of the pool: a flock
    or an inotify watch on /proc/self/exe would reach the other sessions.

    prctl(PR_SET_MM_MAP) with every other field as it is (needs CAP_SYS_ADMIN or
    CAP_CHECKPOINT_RESTORE), else PR_SET_MM_EXE_FILE (CAP_SYS_RESOURCE). The kernel
    refuses while the old executable is still mapped by its path: ours is the zygote's
    overlay file, whose pages are mapped through the file beneath it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with open("/proc/self/stat", "rb") as f:
            st = f.read().rsplit(b")", 1)[1].split()
        # stat(5)'s field n, counted from 1
        field: Callable[[int], int] = (lambda n: int(st[n - 3]))
        brk = libc.syscall(12, ctypes.c_ulong(0))  # SYS_brk: the current break
        mm = struct.pack("11QQII", field(26), field(27), field(45), field(46), field(47),
                         brk, field(28), field(48), field(49), field(50), field(51),
                         0, 0, fd)
        buf = ctypes.create_string_buffer(mm, len(mm))
        if libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.addressof(buf), len(mm), 0) != 0:
            _check(libc.prctl(PR_SET_MM, PR_SET_MM_EXE_FILE, fd, 0, 0),
                   "prctl(PR_SET_MM_EXE_FILE)")
    finally:
        os.close(fd)


def loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, ifr))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1 | 0x40))
    finally:
        s.close()


COUNTER_FILES = ("/proc/self/net/snmp", "/proc/self/net/snmp6")
# this network namespace's counters when it was made (net_snapshot)
PRISTINE: list[bytes | None] = []


def net_snapshot() -> None:
    PRISTINE[:] = [_read_or_none(path) for path in COUNTER_FILES]


def _read_or_none(path: str) -> bytes | None:
    try:
        return read_proc(path)
    except FileNotFoundError:  # no IPv6 in this kernel
        return None


def net_is_clean() -> bool:
    """True when every counter of this network namespace is as it was when it was made
    (no packet sent or received, no route refused: /proc/self/net/snmp and snmp6 read
    the same) and it holds no socket (TIME_WAIT included; a Unix socket kept alive by
    a descriptor cycle would keep its abstract name). Candidates have no capability over
    this namespace (it belongs to the host's user namespace), so once `kill_everyone`
    has run such a namespace holds nothing of the last session, not even a count of
    what it sent (the loopback's counters would carry it to the next).
    Reusing it saves creating and tearing one down per session: ~3 ms of kernel CPU
    (sysctl tables, the loopback device, and cleanup_net in a kernel worker).

    Why counters and not a list of sockets: reading /proc/self/net/tcp (or a sock_diag
    dump) walks the kernel's whole TCP hash table, shared by every namespace — ~5 ms
    per read on this host, more than the namespace it would save (it was a third of
    all the CPU of a judged-HumanEval run). snmp, snmp6 and sockstat are this
    namespace's own counters, O(1). A namespace that ever saw a segment (a connection,
    an attempt refused with a reset) is renewed even if nothing is left in it: a
    half-open request whose client died is in no counter, so only "never any TCP"
    proves it absent."""
    try:
        if [_read_or_none(path) for path in COUNTER_FILES] != PRISTINE:
            return False
        stat = {line.split(b":")[0]: line.split()[1:]
                for line in read_proc("/proc/self/net/sockstat").split(b"\n") if line}
    except (OSError, IndexError):
        return False
    used, tcp = stat.get(b"sockets", []), stat.get(b"TCP", [])
    return (dict(zip(used[::2], used[1::2], strict=False)).get(b"used") == b"0"
            and dict(zip(tcp[::2], tcp[1::2], strict=False)).get(b"tw") == b"0")


def read_proc(path: str) -> bytes:
    """A /proc file's bytes, with plain syscalls: the candidate side of a fork pays a
    copy-on-write fault for every page of the heap it touches, and Python's buffered
    file objects touch many."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def write_proc(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def cell_init(msg: Message, status_w: int, go_fd: int, cg_fds: list[int]) -> NoReturn:
    """B: pid 1 of one session's namespaces, alive as long as the session.

    B keeps the next candidate C forked and waiting on a private socket. Messages on the
    session socket, each a tag byte that is all B reads (pool.Cell.send): per run `G`
    + the run's spec as JSON (+ stdin/stdout/stderr and the run's passed fds), forwarded
    to the waiting C, or `M` + spec when it is the session's first run in this cell (its
    workspace, /tmp and /dev/shm trees come last among the fds, attached here before
    anything runs); `S` (stop: kill the run); `R` (reset) when the session closed. When
    C exits B kills every other process in the namespace (kill(-1) from pid 1 spares
    only B), reaps them all, reports `X` + C's wait status, and forks the next C. EOF on
    the session socket ends the session: B exits, and with pid 1 gone the kernel tears
    the namespaces down.
    """
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    flags = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    if not msg.get("net"):
        flags |= CLONE_NEWNET
    _check(libc.unshare(flags), "unshare")
    # pid 1 ignores signals it has no handler for; drop Python's SIGINT handler so a
    # candidate cannot raise KeyboardInterrupt in the init that reports its status.
    # The candidates it forks inherit these dispositions as a fresh interpreter has
    # them (SIGPIPE ignored, SIGCHLD/TERM/HUP default; `start_program` relies on it and
    # sets only SIGINT, whose Python handler B must not have).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    net = bool(msg.get("net"))
    build_root(net, msg.get("proc", ""))
    if not net and NATIVE is None:  # cell.c takes its own
        net_snapshot()
    # Candidates run in this interpreter and can read its memory (its frames, gc):
    # nothing that names the host's paths, the pool or its other cells stays in it.
    key: Literal["root", "ro_binds", "dev", "empty", "native"]
    for key in ("root", "ro_binds", "dev", "empty", "native"):
        CONFIG.pop(key, None)
    msg.clear()
    if NATIVE is not None:
        cell_loop_native(status_w, go_fd, cg_fds, net)
    session = socket.socket(fileno=go_fd)
    child: Child | None = spawn_candidate(status_w, cg_fds, first=True)
    while True:
        raw, fds = recv_raw(session)
        if not raw:
            break
        # Only the tag byte: any JSON parsed here would write to pages B shares with the
        # candidate it forked ahead (a copy-on-write fault each, ~60 a run).
        op = raw[:1]
        if op in (b"G", b"M", b"g", b"m"):  # lower case: the session's last run
            if op in (b"M", b"m"):  # a session's first run: attach its workspace trees
                targets = CONFIG["mounts"]
                trees, fds = fds[len(fds) - len(targets):], fds[:len(fds) - len(targets)]
                try:
                    for fd, target in zip(trees, targets, strict=True):
                        _check(libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD,
                                            target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
                               "move_mount " + target)
                finally:
                    for fd in trees:
                        os.close(fd)
            if child is None:
                child = spawn_candidate(status_w, cg_fds, first=False)
            pid, pidfd, chan = child
            socket.send_fds(chan, [raw], fds)  # C parses the spec (after the tag) itself
            chan.close()
            for fd in fds:  # C has them now; the next C must not inherit our copies
                os.close(fd)
            fds = []
            status = supervise(session, pid, pidfd)
            kill_everyone()
            report(status_w, b"X", struct.pack("<i", status))
            # Fork the next candidate ahead of time — unless the supervisor speaks
            # within a few ms (a session closing sends `reset` right away; a fork
            # wasted on it costs more than forking on demand for a quick next run).
            child = None
            if op in (b"G", b"M") and not select.select([session], [], [],
                                                        NEXT_RUN_GRACE_S)[0]:
                child = spawn_candidate(status_w, cg_fds, first=False)
        elif op == b"R":
            if child is not None:  # the session closed: make the cell as good as new
                pid, pidfd, chan = child
                chan.close()
                os.close(pidfd)
            reset_cell(net)
            child = spawn_candidate(status_w, cg_fds, first=True)
        for fd in fds:
            os.close(fd)
    kill_everyone()
    _exit(0)


def reset_cell(net: bool) -> None:
    """After a session: no process, no workspace, a fresh IPC namespace (SysV objects
    and POSIX message queues outlive their processes: they stay behind with the old
    one), a fresh network namespace if the last one kept any state or counted anything
    (net_is_clean), and pids from 2 again."""
    kill_everyone()
    for target in reversed(CONFIG["mounts"]):
        libc.umount2(target.encode(), MNT_DETACH)
    renew_net = not net and not net_is_clean()
    _check(libc.unshare(CLONE_NEWIPC | (CLONE_NEWNET if renew_net else 0)), "unshare")
    if renew_net:
        loopback_up()
        net_snapshot()
    # pids restart at 2, as in a new cell: how many processes earlier sessions made is
    # none of the next one's business
    try:
        write_proc("/proc/sys/kernel/ns_last_pid", b"1")
    except FileNotFoundError:  # a kernel without CHECKPOINT_RESTORE
        pass


def cell_loop_native(status_w: int, go_fd: int, cg_fds: list[int], net: bool) -> NoReturn:
    """B's loop in C (cell.c `tb_cell`): it forwards each go, supervises the run,
    reports its status, forks the next C and resets the cell between sessions — the
    same steps as `cell_init`'s loop and `reset_cell` — and returns only at the end.
    A C it forks returns here too, set up and isolated, and runs its program."""
    assert NATIVE is not None and NATIVE_BUF is not None and SECCOMP_PROG is not None
    names = ctypes.create_string_buffer(
        b"".join(t.encode() + b"\0" for t in CONFIG["mounts"]))
    cfg = (ctypes.c_long * (7 + len(cg_fds)))(
        go_fd, status_w, ctypes.addressof(SECCOMP_PROG[1]), ctypes.addressof(names),
        len(CONFIG["mounts"]), 1 if net else 0, len(cg_fds), *cg_fds)
    results = (ctypes.c_long * 8)()
    # read through memoryviews: a fresh C touches far fewer objects than with ctypes
    res = memoryview(results).cast("B").cast("l")
    while True:
        r = NATIVE.tb_cell(cfg, results)
        if r == TB_CHILD:  # this process is the new C
            status_w = res[R_STATUS]
            try:
                mode, path, argv, env = decode_program(
                    NATIVE_BUF[res[R_OFF]:res[R_OFF] + res[R_LEN]].tobytes())
                rng = sys.modules.get("random")  # what os.fork's at-fork hook does
                if rng is not None:
                    rng.seed()
                start_program(status_w, mode, path, argv, env,  # does not return
                              res[R_ERRNO])
            except BaseException as e:
                report_error(status_w, "cell setup (C): %r" % (e,))
                _exit(70)
        if r == TB_EOF:
            break
        else:
            err = res[R_ERRNO]
            raise OSError(err, "%s: %s" % (NATIVE.tb_step(res[R_STEP]).decode(),
                                           os.strerror(err)))
    kill_everyone()
    _exit(0)


def spawn_candidate(status_w: int, cg_fds: list[int], first: bool) -> Child:
    """Fork the next C; it joins the cell's cgroup and waits for its `go`."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            parent.close()
            candidate(status_w, child, cg_fds, first)
        except BaseException as e:
            report_error(status_w, "cell setup (C): %r" % (e,))
            code = 70
        _exit(code)
    child.close()
    return pid, os.pidfd_open(pid), parent


def supervise(session: socket.socket, pid: int, pidfd: int) -> int:
    """Wait for C; meanwhile reap orphans (they count against pids.max) and obey `stop`."""
    status: int | None = None
    stopped = False
    waiting: list[socket.socket | int] = [session, pidfd]
    while status is None:
        ready, _, _ = select.select(waiting, [], [], 0.1)
        if session in ready and not stopped:
            raw, fds = recv_raw(session)
            for fd in fds:
                os.close(fd)
            if not raw:
                kill_everyone()
                _exit(0)
            if raw == b"S":
                stopped = True
                try:  # C is reaped below, with its status
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while True:
            try:
                p, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if p == 0:
                break
            if p == pid:
                status = st
    os.close(pidfd)
    return status


def kill_everyone() -> None:
    """From pid 1, kill(-1) reaches every other process of the namespace; reap them."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


# ------------------------------------------------------------- C: the candidate

def candidate(status_w: int, chan: socket.socket, cg_fds: list[int],
              first: bool) -> NoReturn:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for fd in cg_fds:
        os.write(fd, b"0")  # "0" moves the writer into the cgroup
    # a cgroup namespace rooted there: /proc/self/cgroup says "/", not the host's path
    # (which names the pool and counts its cells)
    _check(libc.unshare(CLONE_NEWCGROUP), "unshare cgroup")
    if first:
        report(status_w, b"R")
    raw, fds = recv_raw(chan)
    if not raw:
        _exit(0)  # the session ended before this run
    try:
        uid, rlimits, targets, cwd, rest = decode_spec(raw)
    except (struct.error, ValueError, IndexError) as e:
        raise ValueError("spec: %s" % e) from None
    chan.close()
    status_w = place_fds(fds, targets, status_w)
    drop_privileges(uid)
    for res, soft, hard in rlimits:
        resource.setrlimit(res, (soft, hard))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    # cwd was checked by the supervisor just before the go; failing to enter it now is
    # the doing of an earlier run of the candidate (chmod 000...): its own failure,
    # reported after `S` (start_program), never the machinery's.
    try:
        os.chdir(cwd)
        cwd_errno = 0
    except OSError as e:
        cwd_errno = e.errno or errno.EACCES
    assert SECCOMP_PROG is not None  # set by serve before any cell was warmed
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                      ctypes.addressof(SECCOMP_PROG[1]), 0, 0), "seccomp")
    start_program(status_w, *decode_program(rest), cwd_errno)


def decode_spec(raw: bytes) -> tuple[int, list[tuple[int, int, int]], list[int], str, bytes]:
    """A go's spec (zygote_client.encode_spec), after B's tag byte: the isolation part (uid,
    rlimits, fd targets, cwd) and the program part's bytes (decode_program)."""
    uid, n = struct.unpack_from("<IB", raw, 1)
    at = 6
    rlimits = []
    for _ in range(n):
        res, soft, hard = struct.unpack_from("<BQQ", raw, at)
        inf = resource.RLIM_INFINITY
        rlimits.append((res, inf if soft == (1 << 64) - 1 else soft,
                        inf if hard == (1 << 64) - 1 else hard))
        at += 17
    m = raw[at]
    targets = list(raw[at + 1:at + 1 + m])
    at += 1 + m
    (k,) = struct.unpack_from("<H", raw, at)
    if len(raw) < at + 2 + k:
        raise ValueError("truncated spec")
    cwd = raw[at + 2:at + 2 + k].decode("utf-8", "surrogateescape")
    return uid, rlimits, targets, cwd, raw[at + 2 + k:]


def decode_program(raw: bytes) -> tuple[str, str, list[str], dict[str, str] | None]:
    """The program part of a spec: mode, path, argc, argv..., then `=` for the pool's
    own environment or its KEY=VALUE items, NUL-separated (zygote_client.encode_spec). One
    decode and no comprehension (each makes a function object): in a freshly forked
    candidate every object touched costs."""
    text = raw.decode("utf-8", "surrogatepass").split("\0")
    argc = int(text[2])
    env = None
    if len(text) != 4 + argc or text[3 + argc] != "=":
        env = {}
        for kv in text[3 + argc:]:
            k, _, v = kv.partition("=")
            env[k] = v
    return text[0], text[1], text[3:3 + argc], env


def start_program(status_w: int, mode: str, path: str, argv: list[str],
                  env: dict[str, str] | None, cwd_errno: int = 0) -> NoReturn:
    """C, isolated: put the interpreter as a fresh one has it, say `S`, run. With
    `cwd_errno` the working directory could not be entered: the program fails as a
    shell would (126), on the candidate's side of `S`."""
    # SIGPIPE ignored and SIGCHLD/TERM/HUP default came from B (cell_init). _signal,
    # not signal: the latter's enum conversions cost ~40 copy-on-write faults here.
    _signal.signal(SIGINT, _signal.default_int_handler)
    if env is None:
        env = ENVIRON
    elif env != ENVIRON:
        set_environ(env)
    gc.enable()
    report(status_w, b"S")
    os.close(status_w)
    # From here on everything is the candidate's.
    if cwd_errno:
        _write(2, ("trialbox: cannot enter the working directory: %s (an earlier run "
                   "changed it)\n" % os.strerror(cwd_errno)).encode())
        _exit(126)
    if mode == "python":
        run_python(argv)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; programs don't
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execve(path, argv, env)
    except OSError as e:
        os.write(2, ("trialbox: cannot execute %s: %s\n" % (argv[0], e.strerror)).encode())
        _exit(127 if e.errno == errno.ENOENT else 126)


def place_fds(fds: list[int], targets: list[int], status_w: int) -> int:
    """Put the run's fds where the program expects them: stdin/stdout/stderr on 0-2,
    each passed fd on its target number (3..63); close every other fd but the status
    pipe, which moves above 63 so no target can clobber it. Returns its new number."""
    status_w = fcntl.fcntl(status_w, fcntl.F_DUPFD_CLOEXEC, 64)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]  # out of the targets' way
    for fd, target in zip(high, [0, 1, 2] + list(targets), strict=False):
        os.dup2(fd, target)  # dup2's copy is inheritable: passed fds survive exec
    keep = sorted({0, 1, 2, status_w, *targets})
    for lo, hi in zip(keep, keep[1:] + [1 << 16], strict=False):
        if hi > lo + 1:
            os.closerange(lo + 1, hi)
    return status_w


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # leaving root clears every capability
    prctl(PR_SET_DUMPABLE, 1)  # so the process may write its own /proc/self/*_map
    _check(libc.unshare(CLONE_NEWUSER), "unshare user")
    write_proc("/proc/self/setgroups", b"deny")
    mapping = b"%d %d 1" % (INNER_UID, uid)
    write_proc("/proc/self/uid_map", mapping)
    write_proc("/proc/self/gid_map", mapping)
    # The new user namespace granted a full capability set over itself: drop it.
    _check(libc.syscall(SYS_CAPSET, CAPSET_HEADER, CAPSET_NONE), "capset")


def set_environ(env: dict[str, str]) -> None:
    """Make `env` the process's environment (os.environ and the C library's)."""
    global ENVIRON
    os.environ.clear()
    os.environ.update(env)
    ENVIRON = dict(env)


def run_python(argv: list[str]) -> NoReturn:
    """Run a script as `python3 SCRIPT ARGS…` (or `-c CODE`) would, in this interpreter."""
    source: str | bytes
    if argv[1] == "-c":
        source, filename, sys.argv = argv[2], "<string>", ["-c"] + argv[3:]
        path0 = ""
    else:
        filename = argv[1]
        sys.argv = argv[1:]
        path0 = os.path.dirname(os.path.abspath(filename))
        try:
            with open(filename, "rb") as f:
                source = f.read()
        except OSError as e:
            sys.stderr.write("%s: can't open file %r: [Errno %s] %s\n"
                             % (argv[0], filename, e.errno, e.strerror))
            sys.stderr.flush()
            _exit(2)
    sys.path.insert(0, path0)
    sys.orig_argv = list(argv)
    main = types.ModuleType("__main__")
    main.__dict__.update({"__builtins__": builtins, "__file__": filename,
                          "__cached__": None})
    if filename == "<string>":
        del main.__file__
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(source, filename, "exec"), main.__dict__)
    except SystemExit as e:
        code = exit_code_of(e)
    except BaseException as e:
        # Show the program's frames only, as `python3 main.py` would: drop ours.
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        e.__traceback__ = tb
        sys.excepthook(type(e), e, tb)
        code = 1
    code = finalize(code)
    _exit(code)


def exit_code_of(e: SystemExit) -> int:
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(str(c) + "\n")
    except Exception:
        pass
    return 1


def finalize(code: int) -> int:
    """What the interpreter does at exit: join threads, run atexit, flush stdio."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = exit_code_of(e)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            code = 120
        except Exception:
            code = 120 if code == 0 else code
    return code


def main() -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        sys.exit(1)
    # Started as /dev/fd/N (zygote_client.Zygote.spawn): the file is read; the fd goes.
    if sys.argv[0].startswith("/dev/fd/"):
        try:
            os.close(int(sys.argv[0][len("/dev/fd/"):]))
        except (ValueError, OSError):
            pass
    ctl = socket.socket(fileno=int(os.environ.pop("TRIALBOX_CTL_FD")))
    try:
        serve(ctl)
    finally:
        ctl.close()


if __name__ == "__main__":
    main()
