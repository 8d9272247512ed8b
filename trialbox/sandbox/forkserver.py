"""The fork server that runs as process 1 inside a gvisor or container session (oci.py).

Standalone: it runs under the sandbox's own /usr/bin/python3 (`-I -B`), imports nothing
of trialbox and is copied into the session's bundle, so the candidate learns nothing of
the host. One session = one long-lived container whose init is this program; each run
is one fork of it, made ahead of the run (`Waiting`), so a warm run costs an exec (or, for
Python, nothing: the child runs the code in this already started interpreter), not a
container start.

Protocol (frames: 1 tag byte, u32 little-endian length, payload):

    supervisor -> server   R json(spec)     start a run (stdin follows as one I frame)
                           I bytes          the run's whole stdin
                           K                kill the run in flight (every process)
                           N                a new attempt: empty /workspace, /tmp and
                                            /dev/shm (recycling; no process is alive)
    server -> supervisor   H                hello: ready for runs
                           S                the program is about to exec
                           O bytes / E bytes   a chunk of its stdout / stderr
                           X json           the run is over: {"status": wait status} or
                                            {"error": text} (the machinery failed)
                           N json           the N is done: {} or {"error": text}

A run ends when its first process exits (or a K comes): then every other process in the
sandbox is killed (`kill(-1, SIGKILL)` from process 1 spares only process 1), all are
reaped, the pipes are drained to EOF, and X is sent. Nothing outlives a run.

The supervisor counts output and time from outside and sends K; this program never
decides a limit was reached.
"""

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

HEADER = struct.Struct("<cI")
SANDBOX_UID = 1000
"""Every run's uid and gid inside the sandbox (oci.SANDBOX_UID)."""
RLIMITS = {"RLIMIT_CPU": resource.RLIMIT_CPU, "RLIMIT_FSIZE": resource.RLIMIT_FSIZE,
           "RLIMIT_CORE": resource.RLIMIT_CORE, "RLIMIT_NOFILE": resource.RLIMIT_NOFILE,
           "RLIMIT_NPROC": resource.RLIMIT_NPROC, "RLIMIT_AS": resource.RLIMIT_AS}

IN, OUT = int(os.environ.get("TB_CTL_FD", "0")), 1
"""Frames come in on the control socket (0 under runsc, 3 under runc and crun: see
oci.Engine.ctl_fd); frames go out on stdout."""


def send(tag, data=b""):
    msg = HEADER.pack(tag, len(data)) + data
    view = memoryview(msg)
    while view:
        n = os.write(OUT, view)
        view = view[n:]


CTL = None
"""The control socket as a socket object (main): fds can come with a run."""
INFDS = []
"""Fds received and not yet handed to a run."""
INBUF = bytearray()
"""What was read from the supervisor and not yet parsed (a run's R and I frames come in
one write, read with one read)."""


def buffered_frame():
    """The next complete frame already read, or None."""
    if len(INBUF) < HEADER.size:
        return None
    tag, n = HEADER.unpack_from(INBUF)
    if len(INBUF) < HEADER.size + n:
        return None
    payload = bytes(INBUF[HEADER.size:HEADER.size + n])
    del INBUF[:HEADER.size + n]
    return tag, payload


def buffered_frame_pending():
    return len(INBUF) >= HEADER.size and len(INBUF) >= HEADER.size + HEADER.unpack_from(
        INBUF)[1]


def read_frame():
    while True:
        frame = buffered_frame()
        if frame is not None:
            return frame
        b, anc, _flags, _addr = CTL.recvmsg(RECV_SIZE, socket.CMSG_SPACE(64 * 4))
        for level, kind, data in anc:  # fds for a run (pass_fds), in order
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                INFDS.extend(struct.unpack("%di" % (len(data) // 4),
                                           data[:len(data) - len(data) % 4]))
        if not b:
            raise EOFError
        INBUF.extend(b)


RECV_SIZE = 1 << 16
"""Bytes asked of one recvmsg. Python allocates the whole buffer first: 1 MiB was an
mmap, a page fault, an mremap and an munmap per call, each a trip through gVisor's
Sentry; a longer message takes several reads (frames are reassembled)."""

SPEC_FD = 100
"""Where a waiting child keeps its end of the spec socket (above every pass_fds target)."""


def prepare(spec_r, out_w, err_w):
    """In a child forked ahead of its run, before the run is known: everything that is
    the same for every run (stdio, the sandbox uid, no privileges, the seccomp filter),
    so the run itself waits only for its own limits, fds, directory and exec."""
    os.setsid()
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(spec_r, SPEC_FD)
    os.dup2(os.memfd_create("stdin", 0), 0)
    os.closerange(3, SPEC_FD)
    os.closerange(SPEC_FD + 1, 1 << 16)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if RECYCLING:
        new_ipc_namespace()
        drop_bounding()
    os.setgroups([])
    os.setgid(SANDBOX_UID)
    os.setuid(SANDBOX_UID)  # leaving root clears every capability
    load_seccomp()


SERVER_CAPS = (1, 3, 21, 8)
"""CAP_DAC_OVERRIDE, CAP_FOWNER (emptying the session's files between attempts),
CAP_SYS_ADMIN (a new IPC namespace per run), CAP_SETPCAP (needed to drop the others,
so last): what the server holds on a recycling tier (oci.Engine.recycle) and a run
never does."""
RECYCLING = False
"""Whether this server holds SERVER_CAPS (main)."""


def drop_bounding():
    """Take SERVER_CAPS out of the run's bounding set (all of them are in it: main
    checked, or RECYCLING would be False)."""
    for cap in SERVER_CAPS:
        if LIBC.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(LIBC.errno(), "prctl(PR_CAPBSET_DROP)")


def place_fds(fds, targets):
    """Put the run's passed fds on the numbers the program expects (3..63)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, SPEC_FD + 1) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets, strict=True):
        os.dup2(fd, target)  # inheritable: kept across exec
        os.close(fd)


def child(spec, stdin, fds):
    """The run: its stdin, fds, limits and directory, then exec (or run Python here)."""
    try:
        place_fds(fds, spec.get("fds", []))
        view = memoryview(stdin)
        while view:
            view = view[os.write(0, view):]
        os.lseek(0, 0, os.SEEK_SET)
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(RLIMITS[name], (soft, hard))
        os.chdir(spec["cwd"])
        if spec["mode"] == "python":
            gc.enable()
            os.environ.clear()
            os.environ.update(spec["env"])
            signal.signal(signal.SIGINT, signal.default_int_handler)
            run_python(spec["argv"])
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        os.execve(spec["path"], spec["argv"], spec["env"])
    except OSError as e:
        os.write(2, ("trialbox: cannot run %s: %s\n" % (spec["argv"][0], e.strerror))
                 .encode())
        os._exit(127)
    except BaseException as e:  # the child must never return
        os.write(2, ("trialbox: cannot run %s: %r\n" % (spec["argv"][0], e)).encode())
        os._exit(127)
    os._exit(127)


def run_python(argv):
    """Run a script as `python3 SCRIPT ARGS...` (or `-c CODE`) would, in this warm
    interpreter (the namespace tier's zygote does the same: zygote.run_python)."""
    import builtins
    import types
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
            sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n"
                             % (argv[0], filename, e.errno, e.strerror))
            sys.stderr.flush()
            os._exit(2)
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
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        e.__traceback__ = tb
        sys.excepthook(type(e), e, tb)
        code = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = exit_code_of(e)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120 if code == 0 else code
    os._exit(code)


def exit_code_of(e):
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


class Waiting:
    """A child forked ahead of its run (a fork of this interpreter costs ~40 ms in
    gVisor): it blocks on a pipe until the run's spec and stdin arrive."""

    def __init__(self):
        spec_r, self.spec_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            gc.disable()  # a collection would touch (copy) every page of the heap
            signal.set_wakeup_fd(-1)
            self.spec_w.detach()  # closed by prepare(): no object may close it again
            try:
                prepare(spec_r.detach(), out_w, err_w)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, SPEC_FD)
            except BaseException as e:  # never return into the server
                os.write(2, ("trialbox: sandbox set-up failed: %r\n" % (e,)).encode())
                os._exit(126)
            chunks, fds = [], []
            while True:
                b, anc, _flags, _addr = sock.recvmsg(RECV_SIZE, socket.CMSG_SPACE(64 * 4))
                for level, kind, fdata in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.extend(struct.unpack("%di" % (len(fdata) // 4),
                                                 fdata[:len(fdata) - len(fdata) % 4]))
                if not b:
                    break
                chunks.append(b)
            sock.close()
            data = b"".join(chunks)
            if not data:
                os._exit(0)
            (n,) = struct.unpack_from("<I", data)
            child(json.loads(data[4:4 + n]), data[4 + n:], fds)
        spec_r.close()
        for fd in (out_w, err_w):
            os.close(fd)

    def discard(self):
        """This child will get no run (a reset): EOF on its spec socket ends it."""
        for fd in (self.out_r, self.err_r):
            os.close(fd)
        self.spec_w.close()

    def go(self, spec_bytes, stdin, fds):
        data = struct.pack("<I", len(spec_bytes)) + spec_bytes + stdin
        try:
            sent = socket.send_fds(self.spec_w, [data], fds) if fds else 0
            self.spec_w.sendall(data[sent:])
        finally:
            self.spec_w.close()
            for fd in fds:  # the child has them now
                os.close(fd)


SECCOMP_PATH = "/.tb/seccomp.bpf"
FILTER = None


class Libc:
    """The libc calls a run's child makes before it runs (prctl, unshare), made once by
    the server (main): a child that loaded ctypes' CDLL and built the seccomp program
    itself created classes and objects all over the inherited heap, and under gVisor
    each page it writes is a fault and a copy."""

    def __init__(self):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        self.prctl, self.unshare, self.errno = libc.prctl, libc.unshare, ctypes.get_errno
        self.seccomp = None  # the PR_SET_SECCOMP argument: a sock_fprog of FILTER
        if FILTER:
            class Prog(ctypes.Structure):
                _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
            self._prog = Prog(len(FILTER) // 8, FILTER)
            self.seccomp = ctypes.byref(self._prog)


LIBC = None
"""A `Libc` (main)."""


def load_seccomp():
    """no_new_privs, then the namespace tier's deny-list (seccomp.py), as in its cells."""
    if LIBC.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(LIBC.errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if LIBC.seccomp is None:
        raise OSError(2, "no seccomp filter at " + SECCOMP_PATH)
    if LIBC.prctl(22, 2, LIBC.seccomp, 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(LIBC.errno(), "prctl(PR_SET_SECCOMP)")


def new_ipc_namespace():
    """Move this process (a run's child, before it drops root) into an IPC namespace of
    its own: SysV shared memory, semaphores, message queues and POSIX message queues of
    a run are gone with its last process, never seen by the next run or attempt."""
    if LIBC.unshare(0x08000000) != 0:  # CLONE_NEWIPC
        raise OSError(LIBC.errno(), "unshare(CLONE_NEWIPC)")


EMPTIED = ("/workspace", "/tmp", "/dev/shm")


def empty_files():
    """Delete everything in the session's writable directories from inside the sandbox
    (gVisor keeps host files open for what it has cached, so a delete from the host
    alone would not give their space back). No run is alive: nothing can race this.
    Returns "" or why it failed."""
    import shutil
    try:
        for top in EMPTIED:
            for name in os.listdir(top):
                p = os.path.join(top, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)  # by fd, links never followed
                else:
                    os.unlink(p)
    except OSError as e:
        return "emptying %s failed: %s" % (top, e)
    return ""


def strays(waiting_pid):
    """Processes alive besides this server and the waiting child (none between runs)."""
    return [int(p) for p in os.listdir("/proc")
            if p.isdigit() and int(p) not in (os.getpid(), waiting_pid)]


def kill_all():
    """Kill every process but this one, then reap them all."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    reap(block=True)


def reap(block=False):
    """Reap exited children (orphans of the run come to us: we are process 1)."""
    reaped = {}
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return reaped
        except InterruptedError:
            continue
        if pid == 0:
            return reaped
        reaped[pid] = status


def run(waiting, spec_bytes, stdin, fds):
    send(b"S")
    waiting.go(spec_bytes, stdin, fds)
    pid = waiting.pid
    status = None
    readers = {waiting.out_r: b"O", waiting.err_r: b"E"}
    wake_r = WAKE[0]
    while readers or status is None:
        fds = list(readers) + [IN, wake_r]
        ready = [IN] if buffered_frame_pending() else select.select(fds, [], [])[0]
        for fd in ready:
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                if status is None:
                    got = reap()
                    if pid in got:
                        status = got[pid]
                        kill_all()  # the run is over: nothing of it survives
            elif fd == IN:
                tag, _ = read_frame()
                if tag == b"K" and status is None:
                    kill_all()
                    status = -1  # killed on request; the supervisor knows why
            else:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    data = b""
                if data:
                    send(readers[fd], data)
                else:
                    os.close(fd)
                    del readers[fd]
    reap()
    send(b"X", json.dumps({"status": status}).encode())


WAKE = (-1, -1)
"""SIGCHLD's wakeup pipe (main)."""


def preload():
    """Import the stdlib modules runs commonly use and the provider's helper modules
    (OciConfig.preload and preload_sources, in /.tb/preload.json) once, as the namespace
    tier's zygote does (zygote.prewarm)."""
    import types
    try:
        with open("/.tb/preload.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        config = {}
    modules = config.get("modules")
    for name in PRELOAD if modules is None else modules:
        try:
            __import__(name)
        except ImportError:
            pass
    for name, source in config.get("sources", ()):
        module = types.ModuleType(name)
        module.__file__ = "<%s>" % name
        sys.modules[name] = module
        try:
            exec(compile(source, module.__file__, "exec"), module.__dict__)
        except Exception:
            del sys.modules[name]


def main():
    global FILTER, CTL, WAKE, RECYCLING, LIBC
    CTL = socket.socket(fileno=IN)
    WAKE = os.pipe()
    try:
        with open(SECCOMP_PATH, "rb") as f:
            FILTER = f.read()
    except OSError:
        FILTER = None
    LIBC = Libc()
    RECYCLING = all(LIBC.prctl(23, cap, 0, 0, 0) == 1 for cap in SERVER_CAPS)
    for fd in WAKE:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(WAKE[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)  # only the supervisor ends a session
    preload()
    gc.freeze()  # keep the collector off the preloaded heap, shared with each child
    waiting = Waiting()
    send(b"H")
    while True:
        try:
            tag, payload = read_frame()
        except EOFError:
            kill_all()
            return
        if tag == b"R":
            itag, stdin = read_frame()
            if itag != b"I":
                send(b"X", json.dumps({"error": "protocol: I frame expected"}).encode())
                continue
            n = len(json.loads(payload).get("fds", []))
            fds, INFDS[:n] = INFDS[:n], []
            try:
                run(waiting, payload, stdin, fds)
            except OSError as e:
                kill_all()
                send(b"X", json.dumps({"error": "fork server: %s" % e}).encode())
            waiting = Waiting()  # the next run's child, forked while nobody waits
        elif tag == b"N":  # the session is handed to a new attempt (oci.recycle)
            if not RECYCLING:
                err = "this server does not hold the capabilities to reset its session"
            elif strays(waiting.pid):
                err = "processes outlived the last run: %s" % strays(waiting.pid)
            else:
                err = empty_files()
            send(b"N", json.dumps({"error": err} if err else {}).encode())
        # K between runs: nothing to kill


PRELOAD = ("traceback", "linecache", "collections", "functools", "itertools", "math", "re",
           "typing", "heapq", "bisect", "string", "dataclasses", "fractions", "decimal",
           "base64", "json", "types", "atexit")


if __name__ == "__main__":
    sys.exit(main())
