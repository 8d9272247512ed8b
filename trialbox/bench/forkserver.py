"""The warm fork-server baselines of `trialbox bench sandbox`: trialbox's pre-fork design
without its isolation, and inside bubblewrap.

Compared with cold interpreter starts (``plain``, ``bwrap``), trialbox wins mostly by
starting Python warm. These two baselines start it warm too, so the ratios against them
show what trialbox's isolation itself costs:

* ``forkserver`` — no isolation at all: ``/usr/bin/python3 -c FORK_SERVER`` started once
  per session (per worker, off the clock, as a trialbox session is). It pre-forks a child
  that waits for a go; the go is the program's text with its stdout and stderr (passed
  as descriptors over a SOCK_SEQPACKET socketpair); the child runs the program with
  ``exec`` as ``python3 -c`` would and exits; the server reaps it, sends back its exit
  status and pre-forks the next child.
* ``bwrap-forkserver`` — the same server started once per session inside bubblewrap, with
  the isolation of the ``bwrap`` system (every namespace unshared, read-only /usr root,
  private /proc /dev /tmp /workspace, cleared environment, uid 1000, no capabilities,
  trialbox's seccomp filter); per run only a fork inside that sandbox. No cgroup, no
  rlimits, nothing renewed between runs of a session (trialbox gives each run a user
  namespace of its own, seccomp, rlimits and cgroup accounting).

Both servers start in a session of their own (bwrap's ``--new-session``; ``setsid`` for
the unisolated one, so the two get the same treatment). With the kernel's scheduler
autogroups on, a new session is a new CPU-share group: on a loaded machine both fork
servers (and bwrap, which also starts a session per run) get a share of their own,
where trialbox and plain share the bench's. That favours the baselines, never trialbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable

from trialbox.bench.sandbox import (
    CALL_TIMEOUT_S,
    PYTHON,
    SMALL_ENV,
    BwrapSystem,
    Outcome,
    Runner,
    System,
    bwrap_argv,
)

MAX_PROGRAM = 1 << 16
"""The largest program text one go message carries (a SOCK_SEQPACKET datagram)."""

# The server: argv[1] is its end of the control socket. It says b"R" once up, then per
# run: a pre-forked child takes the go (the program; its stdout and stderr as two
# descriptors), runs it and exits; the server sends its exit code (4 bytes, signed).
FORK_SERVER = r"""
import builtins, os, socket, sys, traceback
ctl = socket.socket(fileno=int(sys.argv[1]))
del sys.argv[1:]
ctl.sendall(b"R")
while True:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        msg, fds, _flags, _addr = socket.recv_fds(ctl, %(max)d, 2)
        if not msg or len(fds) != 2:
            os._exit(0)
        ctl.close()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
        code = 0
        try:
            exec(compile(msg.decode(), "<string>", "exec"),
                 {"__name__": "__main__", "__builtins__": builtins})
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            code = code or 1
        os._exit(code & 0xFF)
    _, status = os.waitpid(pid, 0)
    try:
        ctl.sendall(os.waitstatus_to_exitcode(status).to_bytes(4, "big", signed=True))
    except OSError:
        break
""" % {"max": MAX_PROGRAM}


async def _read_fd(fd: int) -> bytes:
    """Everything from `fd` to EOF, without blocking the event loop; closes `fd`."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_reader(fd)
                continue
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


class ForkServerRunner(Runner):
    """One session: one server process (unisolated or in bwrap) and its control socket."""

    def __init__(self, proc: asyncio.subprocess.Process, ctl: socket.socket):
        self.proc, self.ctl = proc, ctl

    @classmethod
    async def start(cls, argv_of: Callable[[int, int | None], list[str]], cwd: str,
                    seccomp: bytes | None = None) -> ForkServerRunner:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = [theirs.fileno()]
        sec_fd = None
        if seccomp is not None:
            # bwrap reads the filter from the fd to its end.
            sec_fd = os.memfd_create("seccomp", 0)
            os.write(sec_fd, seccomp)
            os.lseek(sec_fd, 0, os.SEEK_SET)
            fds.append(sec_fd)
        argv = argv_of(theirs.fileno(), sec_fd)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=SMALL_ENV, cwd=cwd, pass_fds=fds,
                start_new_session=True)
        finally:
            theirs.close()
            if sec_fd is not None:
                os.close(sec_fd)
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            ready = await asyncio.wait_for(loop.sock_recv(ours, 16), CALL_TIMEOUT_S)
        except TimeoutError:
            ready = b""
        if ready != b"R":
            ours.close()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            _out, err = await proc.communicate()
            raise RuntimeError(f"the fork server did not start (exit {proc.returncode}): "
                               f"{err.decode(errors='replace').strip()[-300:]}")
        return cls(proc, ours)

    async def run(self, code: str) -> Outcome:
        data = code.encode()
        if self.ctl.fileno() < 0:
            return Outcome(False, b"", "the fork server was stopped after a time-out")
        if len(data) > MAX_PROGRAM:
            return Outcome(False, b"", f"program over {MAX_PROGRAM} bytes")
        loop = asyncio.get_running_loop()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            socket.send_fds(self.ctl, [data], [out_w, err_w])
        except OSError as e:
            for fd in (out_r, err_r):
                os.close(fd)
            return Outcome(False, b"", f"the fork server is gone: {e}")
        finally:
            os.close(out_w)
            os.close(err_w)
        try:
            out, err, status = await asyncio.wait_for(asyncio.gather(
                _read_fd(out_r), _read_fd(err_r), loop.sock_recv(self.ctl, 4)),
                CALL_TIMEOUT_S)
        except TimeoutError:
            # A late status would be read as the next run's: this session is over.
            self.kill()
            return Outcome(False, b"", f"timed out after {CALL_TIMEOUT_S}s")
        if len(status) != 4:
            return Outcome(False, out, "the fork server closed its socket")
        rc = int.from_bytes(status, "big", signed=True)
        if rc != 0:
            return Outcome(False, out, f"exit {rc}: "
                           f"{err.decode(errors='replace').strip()[-300:]}")
        return Outcome(True, out)

    def kill(self) -> None:
        """SIGKILL the server's process group (it is the leader: the server, its children,
        bwrap's sandbox), and close the socket."""
        self.ctl.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        self.ctl.close()  # the waiting child reads EOF and exits; then the server does
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        else:
            with contextlib.suppress(Exception):
                await self.proc.communicate()


class ForkServerSystem(System):
    """``forkserver``: pre-fork, no isolation."""

    name = "forkserver"

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="trialbox-bench-")

    @staticmethod
    def argv(ctl_fd: int, _seccomp_fd: int | None) -> list[str]:
        return [PYTHON, "-c", FORK_SERVER, str(ctl_fd)]

    async def runner(self) -> Runner:
        return await ForkServerRunner.start(self.argv, self.tmp.name)

    async def close(self) -> None:
        self.tmp.cleanup()


class BwrapForkServerSystem(BwrapSystem):
    """``bwrap-forkserver``: the same server, started once per session inside bwrap."""

    name = "bwrap-forkserver"

    @staticmethod
    def argv(ctl_fd: int, seccomp_fd: int | None) -> list[str]:
        return bwrap_argv(FORK_SERVER, seccomp_fd) + [str(ctl_fd)]

    async def runner(self) -> Runner:
        return await ForkServerRunner.start(self.argv, self.tmp.name, self.seccomp)
