"""gVisor sessions and the sandboxes they run in.

By default each session is a sandbox of its own (a fresh gVisor kernel): what session k
did to the kernel — its pid counter, its TCP/IP statistics — is not there for k+1
(`test_each_session_gets_a_fresh_kernel`, issue 28 class 3).

Opted in (`OciConfig(recycle=True)`, oci.Engine.recycle), a closed session's runsc
sandbox is reset and handed to the next `open()`, so a judged attempt costs a warm run,
not a cold start. What attempt k left — files in /workspace, /tmp and /dev/shm,
processes, SysV and POSIX IPC objects, its environment — must be invisible to attempt
k+1 in the same sandbox; limits still hold there; nothing is left after kill -9 of the
supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from tests.sandbox.conftest import describe
from tests.sandbox.oci_cases import OciHarness
from trialbox.sandbox.gvisor import GVisorProvider
from trialbox.sandbox.oci import OciConfig, cgroup_roots
from trialbox.types import ExecStatus, Limits

LIMITS = Limits(wall_s=10, cpu_s=5, memory_mb=256, pids=64, disk_mb=16)

IPC = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def ipc(create):
    c = 0o1666 if create else 0o666
    return [libc.shmget(0x7101, 4096, c), libc.semget(0x7102, 1, c), libc.msgget(0x7103, c),
            libc.mq_open(b"/tbq", (0o100 | 2) if create else 2, 0o666, None)]
"""

ATTEMPT_K = IPC + r"""
import os, time
made = ipc(True)
for d in ("/workspace", "/tmp", "/dev/shm"):
    open(d + "/left-by-k", "w").write(os.environ["SECRET"])
os.makedirs("/tmp/deep/er"); os.symlink("/etc/passwd", "/tmp/deep/er/link")
os.chmod("/tmp/deep/er", 0o1700)  # sticky
os.chmod("/tmp/deep", 0)
os.chmod("/workspace", 0o500)  # the next attempt could not write its files
if os.fork() == 0:  # a daemon that tries to outlive the run
    os.setsid()
    if os.fork() == 0:
        import signal
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        while True:
            time.sleep(0.05)
    os._exit(0)
print(json.dumps({"made": made, "again": ipc(False)}))
""".replace("import os, time", "import json, os, time")

ATTEMPT_K1 = IPC + r"""
import json, os
procs = []
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid():
        with open("/proc/%s/status" % p) as f:
            procs.append([int(p)] + [l.split()[1] for l in f if l.startswith("Uid:")])
open("/workspace/mine", "w").write("ok")
print(json.dumps({"ipc": ipc(False), "procs": procs, "secret": os.environ.get("SECRET"),
                  "files": {d: sorted(os.listdir(d)) for d in ("/workspace", "/tmp",
                                                               "/dev/shm")}}))
"""


@pytest.fixture(scope="module")
def oci() -> Iterator[OciHarness]:
    h = OciHarness(GVisorProvider(OciConfig(warm=1, recycle=True)))
    yield h
    h.close()


KERNEL_STATE = r"""
import json, os, socket
def tcp():
    rows = [l.split() for l in open("/proc/net/snmp") if l.startswith("Tcp:")]
    return dict(zip(rows[0][1:], map(int, rows[1][1:])))
def lo():
    return [int(x) for l in open("/proc/net/dev") if "lo:" in l
            for x in l.split(":")[1].split()[:2]]
seen = {"pid": os.getpid(), "tcp": tcp(), "lo": lo()}
if os.environ.get("TRAFFIC"):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    c = socket.create_connection(s.getsockname()); a, _ = s.accept()
    c.sendall(b"x" * 4096); a.recv(8192)
    for x in (a, c, s): x.close()
    for _ in range(40):  # pids used
        if os.fork() == 0:
            os._exit(0)
        os.wait()
print(json.dumps(seen))
"""


def test_each_session_gets_a_fresh_kernel() -> None:
    """Session 1 makes TCP traffic on loopback and forks 40 processes; session 2 (the
    next `open()` of a default provider) starts at the same pid and reads zeroed TCP
    and loopback counters: no gVisor kernel serves two sessions. On a recycled sandbox
    it started at pid ~54 and read session 1's TCP counters."""
    h = OciHarness(GVisorProvider(OciConfig(warm=1)))
    try:
        async def body() -> list[dict[str, object]]:
            seen = []
            for traffic in ("1", ""):
                await h.provider.settle(30)
                async with await h.provider.open(LIMITS) as sb:
                    r = await sb.exec(["python3", "-c", KERNEL_STATE],
                                      env={"TRAFFIC": traffic})
                    assert r.status is ExecStatus.OK, describe(r)
                    seen.append(json.loads(r.stdout))
            return seen

        first, second = h.run(body())
    finally:
        h.close()
    assert second["pid"] == first["pid"], (first, second)
    assert second["tcp"] == first["tcp"], (first, second)  # nothing of session 1's
    assert second["lo"] == [0, 0], second
    assert h.provider.recycled == 0


def test_recycled_sandbox_shows_nothing_of_the_last_attempt(oci: OciHarness) -> None:
    """Attempt k and k+1 run in the same runsc sandbox (same container id); k+1 sees no
    file, process, IPC object or environment variable of k. IPC objects live as long as
    their run: the run that made them finds them again (`again`), the session's next
    run does not (each run has an IPC namespace of its own)."""
    p = oci.provider

    async def body() -> tuple[str, str, dict[str, object], dict[str, object]]:
        await p.settle(30)
        async with await p.open(LIMITS) as a:
            cid_a = a.container.cid if a.container else ""
            ra = await a.exec(["python3", "-c", ATTEMPT_K], env={"SECRET": "s3cret-k"})
            assert ra.status is ExecStatus.OK, describe(ra)
            persisted = await a.exec(["python3", "-c", IPC + "print(ipc(False))"])
        before = p.recycled
        async with await p.open(LIMITS) as b:
            cid_b = b.container.cid if b.container else ""
            assert p.recycled == before  # b was recycled when a closed, not now
            rb = await b.exec(["python3", "-c", ATTEMPT_K1])
            assert rb.status is ExecStatus.OK, describe(rb)
        k = json.loads(ra.stdout)
        k["persisted"] = persisted.stdout.decode()
        return cid_a, cid_b, k, json.loads(rb.stdout)

    cid_a, cid_b, k, k1 = oci.run(body())
    assert cid_a and cid_a == cid_b, (cid_a, cid_b)  # the same sandbox, reused
    assert p.recycled >= 1
    assert all(x >= 0 for x in k["made"]) and all(x >= 0 for x in k["again"]), k
    assert k["persisted"].strip() == "[-1, -1, -1, -1]", k  # the session's next run
    assert k1["ipc"] == [-1, -1, -1, -1], k1  # the next attempt: gone
    assert k1["files"] == {"/workspace": ["mine"], "/tmp": [], "/dev/shm": []}, k1
    assert k1["secret"] is None, k1
    assert k1["procs"] == [[1, "0"]], k1  # only the fork server (uid 0)


def test_limits_and_statuses_hold_in_a_recycled_sandbox(oci: OciHarness) -> None:
    """A recycled sandbox enforces the run's limits with the usual statuses: CPU time ->
    timeout, a fork bomb -> the process limit, output -> output; a sandbox killed for
    memory is destroyed, not kept."""
    p = oci.provider

    async def body() -> list[ExecStatus]:
        await p.settle(30)
        statuses = []
        async with await p.open(LIMITS) as sb:
            r = await sb.exec(["python3", "-c", "while True: pass"],
                              limits=LIMITS.with_(cpu_s=1))
            statuses.append(r.status)
        async with await p.open(LIMITS) as sb:
            r = await sb.exec(["python3", "-c", "import os\nn = 0\ntry:\n    while True:\n"
                               "        if os.fork() == 0:\n            import time; "
                               "time.sleep(30)\n        n += 1\nexcept OSError:\n    print(n)"],
                              limits=LIMITS.with_(pids=16))
            assert r.status is ExecStatus.OK and int(r.stdout) <= 16, describe(r)  # fork failed
            r = await sb.exec(["python3", "-c", "print('x' * 10**6)"],
                              limits=LIMITS.with_(output_bytes=4096))
            statuses.append(r.status)
        recycled = p.recycled
        async with await p.open(LIMITS) as sb:
            r = await sb.exec(["python3", "-c", "b = []\nwhile True: b.append(bytearray(1 << 24))"],
                              limits=LIMITS.with_(memory_mb=64))
            statuses.append(r.status)
        statuses.append(ExecStatus.OK if p.recycled == recycled else ExecStatus.INFRA)
        return statuses

    assert oci.run(body()) == [ExecStatus.TIMEOUT, ExecStatus.OUTPUT, ExecStatus.MEMORY,
                               ExecStatus.OK]


def test_nothing_left_after_kill_9_with_recycled_sessions(oci: OciHarness) -> None:
    """A supervisor holding a recycled session warm and another with a run in flight is
    killed with SIGKILL; the next provider's start leaves nothing of it."""
    p = oci.provider
    script = textwrap.dedent("""
        import asyncio
        from trialbox.sandbox.gvisor import GVisorProvider
        from trialbox.sandbox.oci import OciConfig
        async def main():
            p = GVisorProvider(OciConfig(warm=2, recycle=True))
            await p.start()
            await p.settle(30)
            async with await p.open() as a:
                await a.exec(["/bin/true"])
            b = await p.open()
            assert p.recycled == 1, p.recycled
            print(p.id, flush=True)
            await b.exec(["/bin/sleep", "60"])
        asyncio.run(main())
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    owner = proc.stdout.readline().decode().strip()
    assert owner, "the supervisor did not start"
    time.sleep(0.5)  # the run is in flight
    state = os.path.join(p.config.state_dir, owner)
    assert len(os.listdir(os.path.join(state, "s"))) >= 2  # the warm one and the busy one
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    fresh = GVisorProvider(OciConfig(warm=0))
    oci.run(fresh.start())
    try:
        assert not os.path.exists(state), os.listdir(state)
        for root in cgroup_roots():
            assert not os.path.exists(os.path.join(root, f"trialbox-oci/{owner}")), root
        from trialbox.sandbox.mounts import mounts_under
        assert not mounts_under(state)
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert owner not in out, [line for line in out.splitlines() if owner in line]
    finally:
        oci.run(fresh.close())
