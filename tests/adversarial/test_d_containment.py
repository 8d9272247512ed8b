"""Class D of issue 14: containment and limits, on the real namespace tier, both cell
paths (cell.c and the zygote's Python: the `runner` fixture of tests/sandbox).

Each test is an attack a reward-hacking policy could write; each failed on the code
before the fix (docs/adversary.md, section D, says what each one showed then). Section
A's two sandbox items (a workspace made unusable, output pipes held open) are here too:
they are what the sandbox must contain for the judge to stay right.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from tests.conftest import load_scaled
from tests.sandbox import conftest as sandbox_suite
from tests.sandbox.conftest import CANDIDATE_STATUSES, FAST, describe, limits, no_leaks
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.sandbox.cgroups import socket_bytes
from trialbox.sandbox.languages import compile_limits_for
from trialbox.sandbox.namespace import session_carry, session_inodes
from trialbox.types import ExecStatus, Limits

MiB = 1 << 20
runner = sandbox_suite.runner  # fixtures: every test on both cell paths
run_one = sandbox_suite.run_one


def _session(runner, **changes):
    return NamespaceSandbox.open(runner.pool, limits(**changes))


# ------------------------------------------------------- A, sandbox side: no excuses

def test_a_workspace_made_unusable_is_restored_or_the_candidates_failure(runner):
    """chmod 000 on its own workspace, /tmp and /dev/shm, and on a directory it then
    runs in: the next run is never `infra` (before: chdir failed before `S`, retried,
    `infra`)."""
    async def body():
        async with await _session(runner) as sb:
            r1 = await run_code(sb, "import os\nos.mkdir('d')\nos.chmod('d', 0)\n"
                                    "for p in ('/workspace', '/tmp', '/dev/shm'):\n"
                                    "    os.chmod(p, 0)\n")
            r2 = await run_code(sb, "import os; print(len(os.listdir('.')))")
            r3 = await sb.exec(["python3", "-c", "print(1)"], cwd="/workspace/d")
            r4 = await sb.exec(["/bin/true"], cwd="/workspace/d")
            # the mount points themselves cannot be removed or replaced
            r5 = await sb.exec(["/bin/sh", "-c", "rm -rf /workspace/* /tmp /dev/shm; "
                                "rmdir /workspace; mv /workspace /x; true"])
            r6 = await run_code(sb, "print('still here')")
            return r1, r2, r3, r4, r5, r6
    r1, r2, r3, r4, r5, r6 = runner.run(body())
    assert r1.status is ExecStatus.OK, describe(r1)
    assert (r2.status, r2.stdout) == (ExecStatus.OK, b"2\n"), describe(r2)
    for r in (r3, r4):
        assert (r.status, r.exit_code) == (ExecStatus.EXIT, 126), describe(r)
        assert b"cannot enter the working directory" in r.stderr, describe(r)
    assert r5.status is ExecStatus.OK, describe(r5)
    assert (r6.status, r6.stdout) == (ExecStatus.OK, b"still here\n"), describe(r6)
    no_leaks(runner)


def test_a_main_py_made_a_directory_is_the_candidates_outcome(runner):
    """An earlier run turns main.py into a directory: the next run_code is a candidate
    outcome (before: UsageError out of run_code, which lost an agent's whole batch)."""
    async def body():
        async with await _session(runner) as sb:
            r1 = await run_code(sb, "import os\nos.remove('main.py')\nos.mkdir('main.py')")
            r2 = await run_code(sb, "print(1)")
            return r1, r2
    r1, r2 = runner.run(body())
    assert r1.status is ExecStatus.OK, describe(r1)
    assert r2.status is ExecStatus.EXIT and "is a directory" in r2.message, describe(r2)


def test_a_output_pipe_held_open_past_the_process_tree(runner):
    """The program hands its stdout and stderr to a reference outside its process tree
    (here our end of a passed socket; a descriptor cycle in flight on a Unix socket does
    the same until the kernel's garbage collector runs) and exits: the run ends with its
    tree, output kept, status from what it did (before: the supervisor waited for EOF
    to the wall limit, then 15 s more, and reported `infra` with the output lost)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    code = ("import socket, sys\nprint('before', flush=True)\n"
            "s = socket.socket(fileno=3)\n"
            "socket.send_fds(s, [b'x'], [1, 2])\nprint('after', flush=True)\n"
            "sys.exit(3)\n")

    wall_s = load_scaled(3)  # the clock it must not wait for, ample for the run itself

    async def body():
        async with await _session(runner, wall_s=wall_s) as sb:
            await sb.write_file("main.py", code.encode())
            t = time.monotonic()
            r = await sb.exec(["python3", "main.py"], pass_fds={3: theirs.fileno()})
            took = time.monotonic() - t
            # the sandbox took ownership and closed it: our socket object must not close
            # the number again when collected (by then it may be another descriptor's)
            theirs.detach()
            again = await run_code(sb, "print('next')")
            return r, took, again
    try:
        r, took, again = runner.run(body())
    finally:
        ours.close()
    assert (r.status, r.exit_code) == (ExecStatus.EXIT, 3), describe(r)
    assert r.stdout == b"before\nafter\n", describe(r)
    assert took < wall_s, f"took {took:.2f} s: waited for the wall limit ({wall_s:.1f} s)"
    assert (again.status, again.stdout) == (ExecStatus.OK, b"next\n"), describe(again)
    no_leaks(runner)


def test_a_descriptor_cycle_in_flight(runner):
    """A socket sent over itself (with the output pipes, urgent data so the collector is
    not woken by the close) keeps nothing waiting: status and output are the program's."""
    code = ("import socket\na, b = socket.socketpair()\n"
            "socket.send_fds(a, [b'x'], [a.fileno(), b.fileno(), 1, 2], socket.MSG_OOB)\n"
            "print('done', flush=True)\n")

    wall_s = load_scaled(3)  # the clock it must not wait for, ample for the run itself

    async def body():
        async with await _session(runner, wall_s=wall_s) as sb:
            t = time.monotonic()
            r = await run_code(sb, code)
            return r, time.monotonic() - t
    r, took = runner.run(body())
    assert (r.status, r.stdout) == (ExecStatus.OK, b"done\n"), describe(r)
    assert took < wall_s, f"took {took:.2f} s: waited for the wall limit ({wall_s:.1f} s)"


# ------------------------------------------------------------------ seccomp

def test_d_only_the_socket_families_a_program_needs(run_one):
    """AF_VSOCK is not namespaced (it reaches the host's vsock ports); AF_ALG, AF_PACKET
    and the rest are kernel surface no program here needs (before: VSOCK and ALG sockets
    were made)."""
    code = """
import errno, socket
for name, fam, kind in [("UNIX", 1, 1), ("INET", 2, 2), ("INET6", 10, 2), ("NETLINK", 16, 3),
                        ("VSOCK", 40, 1), ("ALG", 38, 5), ("PACKET", 17, 3),
                        ("BLUETOOTH", 31, 1), ("XDP", 44, 3), ("KCM", 41, 2), ("TIPC", 30, 2)]:
    try:
        socket.socket(fam, kind, 0).close()
        print(name, "made")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
try:
    socket.socketpair(40, 1)
    print("VSOCK pair made")
except OSError as e:
    print("VSOCK pair", errno.errorcode.get(e.errno, e.errno))
"""
    r = run_one(code)
    assert r.status is ExecStatus.OK, describe(r)
    lines = dict(line.rsplit(" ", 1) for line in r.stdout.decode().splitlines())
    for name in ("UNIX", "INET", "INET6", "NETLINK"):
        assert lines[name] == "made", r.stdout
    for name in ("VSOCK", "ALG", "PACKET", "BLUETOOTH", "XDP", "KCM", "TIPC", "VSOCK pair"):
        assert lines[name] == "EAFNOSUPPORT", r.stdout


def test_d_page_cache_probes_refused(run_one):
    """preadv2(RWF_NOWAIT) and cachestat() tell whether a file's pages are cached, and
    the host's page cache is shared with every other sandbox (before: both answered)."""
    code = r"""
import ctypes, errno, os
fd = os.open("/usr/bin/python3", os.O_RDONLY)
buf = bytearray(4096)
try:
    os.preadv(fd, [buf], 0, os.RWF_NOWAIT)
    print("nowait answered")
except OSError as e:
    print("nowait", "EOPNOTSUPP" if e.errno == errno.EOPNOTSUPP else e.errno)
print("plain", os.preadv(fd, [buf], 0) == 4096, os.preadv(fd, [buf], 0, os.RWF_HIPRI) >= 0)
libc = ctypes.CDLL(None, use_errno=True)
rng = (ctypes.c_uint64 * 2)(0, 0)
cs = (ctypes.c_uint64 * 8)()
if libc.syscall(451, fd, rng, cs, 0) == 0:
    print("cachestat answered", cs[0])
else:
    print("cachestat", errno.errorcode[ctypes.get_errno()])
"""
    r = run_one(code)
    assert r.status is ExecStatus.OK, describe(r)
    out = r.stdout.decode()
    assert "nowait EOPNOTSUPP" in out and "plain True True" in out, out
    assert "cachestat EPERM" in out, out


# ------------------------------------------------------------------ memory

SOCKET_HOG = r"""
import socket, sys
kind = sys.argv[1]
keep = []
if kind == "tcp":
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    for _ in range(40):
        c = socket.create_connection(srv.getsockname())
        s, _ = srv.accept()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
        c.setblocking(False)
        while True:
            try:
                c.send(b"x" * (1 << 20))
            except OSError:
                break
        keep += [c, s]
else:
    for _ in range(40):
        r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        r.bind(("127.0.0.1", 0))
        w = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(300):
            try:
                w.sendto(b"x" * 60000, r.getsockname())
            except OSError:
                break
        keep += [r, w]
# what the kernel holds in their queues, from this network namespace's own tables
held = 0
for line in open("/proc/net/%s" % kind).read().splitlines()[1:]:
    tx, rx = line.split()[4].split(":")
    held += int(tx, 16) + int(rx, 16)
print(held)
"""


SOCKET_SLACK = 128 << 10
"""What one socket may queue beyond the cell's socket limit (docs/adversary.md, D)."""


@pytest.mark.parametrize("kind", ["tcp", "udp"])
def test_d_socket_buffers_are_bounded_and_counted(runner, kind):
    """40 loopback TCP connections (or UDP sockets) filled and never read (before, on
    cgroup v1: ~420 MiB queued over TCP, ~320 MiB over UDP under a 128 MiB limit, with
    a reported peak of 1-3 MiB). Now the cell's socket buffers have a limit of their
    own (v1: memory_mb / 4) or share the memory limit (v2), and the reported peak
    includes them."""
    lim = limits(memory_mb=128, wall_s=20, cpu_s=20, open_files=256)
    bound = socket_bytes(lim) if runner.pool.cgroups.version == 1 else lim.memory_bytes

    async def body():
        async with await NamespaceSandbox.open(runner.pool, lim) as sb:
            await sb.write_file("hog.py", SOCKET_HOG.encode())
            return await sb.exec(["python3", "hog.py", kind])
    r = runner.run(body())
    assert r.status in CANDIDATE_STATUSES, describe(r)
    if r.status is ExecStatus.OK:
        held = int(r.stdout)
        # over the limit, the kernel still lets each socket queue a little (its minimum
        # under memory pressure): measured ~40 MiB for 80 sockets under a 32 MiB limit
        assert held <= bound + 80 * SOCKET_SLACK, f"{held / MiB:.0f} MiB in socket buffers"
        assert r.peak_memory_bytes >= held, (r.peak_memory_bytes, held)
    no_leaks(runner)


SHM_HOLD = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 40 << 20
shmid = libc.shmget(0, size, 0o1600)  # IPC_PRIVATE, IPC_CREAT|0600: outlives the run
if shmid < 0:
    raise SystemExit("shmget failed: %d" % ctypes.get_errno())
addr = libc.shmat(shmid, None, 0)
ctypes.memset(addr, 1, size)
libc.shmdt(ctypes.c_void_p(addr))
print(shmid)
"""


def test_d_memory_limit_does_not_ratchet_across_runs(runner):
    """Each run leaves 40 MiB of SysV shared memory behind (64 MiB limit). Before, each
    run's limit was memory_mb plus what the cell held, so every run succeeded and the
    session held k x 40 MiB; now what runs leave beyond the workspace's own bound counts
    against the next run: the session stays bounded, and the runs that cannot fit end
    `memory`, never `infra`."""
    lim = limits(memory_mb=64, disk_mb=16)

    async def body():
        async with await NamespaceSandbox.open(runner.pool, lim) as sb:
            out = [await run_code(sb, SHM_HOLD) for _ in range(5)]
            assert sb.cell is not None and sb.cell.files is not None
            held = sb.cell.files.snapshot().usage_bytes
            # a run allowed less than the session now holds does not start at all
            small = await sb.exec(["python3", "-c", "print(1)"],
                                  limits=lim.with_(memory_mb=16))
            return out, held, small
    results, held, small = runner.run(body())
    assert small.status is ExecStatus.MEMORY and "not started" in small.message, \
        describe(small)
    for r in results:
        assert r.status in (ExecStatus.OK, ExecStatus.MEMORY), describe(r)
    ok = sum(r.status is ExecStatus.OK for r in results)
    assert ok <= 2, [describe(r) for r in results]
    assert held <= lim.memory_bytes + session_carry(lim) + 8 * MiB, held / MiB
    no_leaks(runner)


def test_d_empty_files_are_bounded_by_inodes(runner):
    """Empty files take no disk_mb but each holds ~1 KiB of kernel memory; the tmpfs
    now has an inode limit (before: 50,000 files, and as many more each run)."""
    lim = limits(memory_mb=128, disk_mb=16, wall_s=20, cpu_s=20)
    code = ("import os\nn = 0\ntry:\n    for n in range(50000):\n"
            "        os.close(os.open('f%d' % n, os.O_CREAT | os.O_WRONLY))\n"
            "except OSError as e:\n    print('stopped', e.errno)\nprint(n)\n")

    async def body():
        async with await NamespaceSandbox.open(runner.pool, lim) as sb:
            return await run_code(sb, code)
    r = runner.run(body())
    assert r.status is ExecStatus.OK, describe(r)
    assert b"stopped 28" in r.stdout, describe(r)
    assert int(r.stdout.split()[-1]) <= session_inodes(lim), describe(r)


def test_d_disk_fill_under_a_smaller_memory_limit_is_disk(run_one):
    """Filling a 64 MB workspace under a 32 MB memory limit: tmpfs pages are memory, so
    the OOM killer usually fires first — the cause named is the disk either way (before:
    memory). Which limit trips first is a race (the workspace's pages count as what the
    session may carry), so both of the disk's messages are right."""
    r = run_one("f = open('fill', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))",
                memory_mb=32, disk_mb=64)
    assert r.status is ExecStatus.DISK, describe(r)
    assert "workspace files" in r.message or "workspace full" in r.message, describe(r)


def test_d_a_plain_memory_bomb_is_still_memory(run_one):
    r = run_one("b = []\nwhile True:\n    b.append(b'x' * 10**6)", memory_mb=32, disk_mb=64)
    assert r.status is ExecStatus.MEMORY, describe(r)


# ------------------------------------------------------------------ compile

SELF_INCLUDE = """#if __INCLUDE_LEVEL__ == 0
int main(void) { return 0; }
#endif
#if __INCLUDE_LEVEL__ < 40
#include "main.c"
#include "main.c"
#endif
"""
"""2^40 inclusions of itself, and not one diagnostic: gcc would work for years."""


def test_d_compile_runs_under_the_callers_limits(runner):
    """A self-including C file keeps gcc busy for 2^200 inclusions: under a 2 s limit
    and 256 MiB the compile ends in about 2 s, `timeout` — or `memory` naming the
    caller's 256 MiB, on a CPU fast enough for cc1 to grow past it first (a Sapphire
    Rapids host, idle) — (before: 60 s and 1 GiB whatever was asked, and a 12 s compile
    under --timeout 5 reported `ok`)."""
    lim = limits(wall_s=2, cpu_s=2, memory_mb=256)
    assert compile_limits_for(lim).with_(pids=lim.pids) == lim

    async def body():
        async with await NamespaceSandbox.open(runner.pool, lim) as sb:
            return await run_code(sb, SELF_INCLUDE, "c", limits=lim)
    r = runner.run(body())
    assert r.compile is not None, describe(r)
    # ended by the caller's limits, whichever came first on this host and load (before:
    # the compile's own 60 s and 1 GiB), and so within the caller's CPU time
    assert r.message in ("wall time passed Limits.wall_s=2", "CPU time passed Limits.cpu_s=2",
                         "memory passed Limits.memory_mb=256"), describe(r)
    assert r.status is (ExecStatus.MEMORY if "memory" in r.message
                        else ExecStatus.TIMEOUT), describe(r)
    assert r.cpu_ms < 3000, r.cpu_ms


# ------------------------------------------------------------------ what a cell carries

PROBE = r"""
import os
lo = [l.split() for l in open('/proc/net/dev') if l.strip().startswith('lo:')][0]
snmp = open('/proc/net/snmp').read()
print(os.getpid(), lo[1], lo[9], hash(snmp))
"""
NOISE = r"""
import os, socket
for _ in range(200):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r.bind(("127.0.0.1", 0))
for _ in range(100):
    s.sendto(b"x" * 1000, r.getsockname())
try:
    s.sendto(b"x", ("10.9.8.7", 53))
except OSError:
    pass
"""


def test_d_a_recycled_cell_carries_no_count_into_the_next_session(runner):
    """Session one forks 200 processes and sends UDP over loopback; the next session,
    in the same (recycled) cell, starts at the same pid and the same network counters
    as a fresh one (before: its pid counted session one's forks, and the loopback's
    byte counters carried its traffic: a channel between sessions)."""
    async def session(code):
        async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
            r = await run_code(sb, code)
            assert sb.cell is not None
            return r, sb.cell.id

    async def body():
        await runner.pool.settle()
        fresh, c0 = await session(PROBE)
        noisy, c1 = await session(NOISE)
        after, c2 = await session(PROBE)
        return fresh, noisy, after, (c0, c1, c2)
    fresh, noisy, after, cells = runner.run(body())
    assert noisy.status is ExecStatus.OK, describe(noisy)
    assert cells[1] == cells[2], f"the test needs a recycled cell: {cells}"
    f, a = fresh.stdout.split(), after.stdout.split()
    assert a[0] == f[0], (fresh.stdout, after.stdout)  # the same first pid
    assert a[1:3] == [b"0", b"0"], after.stdout  # loopback: nothing received or sent
    assert a[3] == f[3], "the network counters differ from a fresh cell's"


HIDDEN = r"""
import gc, json, sys
needles = [a[::-1] for a in sys.argv[1:]]  # given reversed: argv must not match itself
texts = {}
for path in ("/proc/self/cgroup", "/proc/self/cmdline", "/proc/self/mountinfo",
             "/proc/self/maps", "/proc/self/environ", "/proc/cmdline",
             "/proc/sys/kernel/random/boot_id"):
    texts[path] = open(path, "rb").read().decode(errors="replace")
found = {where: [n for n in needles if n in text] for where, text in texts.items()}
# what the interpreter holds (a candidate runs in the zygote's interpreter): every string
# in a container object, and every frame's names
hits = set()
def look(x):
    if isinstance(x, str) and not any(x is n for n in needles):
        for n in needles:
            if n in x:
                hits.add(n)
for obj in gc.get_objects():
    try:
        items = (list(obj.items()) if isinstance(obj, dict)
                 else obj if isinstance(obj, (list, tuple)) else ())
        for x in items:
            for y in (x if isinstance(x, tuple) else (x,)):
                look(y)
    except Exception:
        pass
f = sys._getframe()
while f is not None:
    for v in list(f.f_globals.values()) + list(f.f_locals.values()):
        look(v)
        if isinstance(v, dict):
            for k, w in v.items():
                look(k); look(w)
    f = f.f_back
found["memory"] = sorted(hits)
cg = texts["/proc/self/cgroup"].splitlines()
print(json.dumps({"found": found, "cgroup_roots": all(l.endswith(":/") for l in cg),
                  "cmdline": texts["/proc/cmdline"],
                  "boot_id": texts["/proc/sys/kernel/random/boot_id"]}))
"""


def test_d_host_paths_pool_and_boot_are_hidden(runner):
    """Nothing inside names the host's state directory, the pool or its cgroup, and
    /proc/cmdline and boot_id read empty (before: /proc/self/cgroup showed
    trialbox/<pool>/<cell>, /proc/self/cmdline the zygote's path under the pool's
    directory, mountinfo the root template's, and both host files their contents)."""
    import json
    needles = [runner.pool.id, runner.pool.config.state_dir + "/", "trialbox/"]

    async def body():
        async with await _session(runner, wall_s=20, cpu_s=20, memory_mb=256) as sb:
            await sb.write_file("probe.py", HIDDEN.encode())
            return await sb.exec(["python3", "probe.py", *(n[::-1] for n in needles)])
    r = runner.run(body())
    assert r.status is ExecStatus.OK, describe(r)
    seen = json.loads(r.stdout)
    assert {k: v for k, v in seen["found"].items() if v} == {}, seen["found"]
    assert seen["cgroup_roots"], r.stdout
    assert seen["cmdline"] == "" and seen["boot_id"] == "", r.stdout


# ------------------------------------------------------------------ the supervisor

def test_d_workspace_listing_survives_hostile_trees(runner):
    """A directory 1,100 levels deep and names that are not UTF-8: listing gives a clear
    UsageError or the names (before: RecursionError); a socket is refused as a file to
    read (before: OSError ENXIO, a 500 in the service)."""
    from trialbox.errors import UsageError
    deep = ("import os\nfor _ in range(1100):\n    os.mkdir('d')\n    os.chdir('d')\n")
    odd = ("import os, socket\nos.mkdir('o')\nopen(b'o/\\xff\\xfe.txt', 'wb').close()\n"
           "socket.socket(socket.AF_UNIX).bind('o/sock')\n")

    async def body():
        async with await _session(runner) as sb:
            r1 = await run_code(sb, odd)
            names = await sb.list_files()
            try:
                await sb.read_file("o/sock")
                sock_err = ""
            except UsageError as e:
                sock_err = str(e)
            r2 = await run_code(sb, deep)
            try:
                await sb.list_files()
                deep_err = ""
            except UsageError as e:
                deep_err = str(e)
            return r1, names, sock_err, r2, deep_err
    r1, names, sock_err, r2, deep_err = runner.run(body())
    assert r1.status is ExecStatus.OK and r2.status is ExecStatus.OK, describe(r2)
    assert os.fsdecode(b"o/\xff\xfe.txt") in names and "o/sock" in names, names
    assert "cannot be read" in sock_err, sock_err
    assert "too deep" in deep_err, deep_err


def test_d_a_large_listing_does_not_block_the_event_loop(runner):
    """20,000 files: the listing runs in a thread while the loop keeps ticking (before:
    on the loop, 0.8 s for 228,000 files with every other session stalled)."""
    lim = limits(disk_mb=256, wall_s=30, cpu_s=30, memory_mb=256)
    code = ("import os\nfor i in range(200):\n    os.mkdir('d%d' % i)\n"
            "    for j in range(100):\n"
            "        os.close(os.open('d%d/f%d' % (i, j), os.O_CREAT | os.O_WRONLY))\n")

    async def body():
        async with await NamespaceSandbox.open(runner.pool, lim) as sb:
            r = await run_code(sb, code)
            ticks = 0
            stop = False

            async def tick():
                nonlocal ticks
                while not stop:
                    await asyncio.sleep(0)
                    ticks += 1
            ticker = asyncio.ensure_future(tick())
            await asyncio.sleep(0)
            base = ticks
            names = await sb.list_files()
            stop = True
            await ticker
            return r, len(names), ticks - base
    r, n, ticks = runner.run(body())
    assert r.status is ExecStatus.OK, describe(r)
    assert n == 20_001, n  # and main.py
    assert ticks > 10, f"the loop ticked {ticks} times while listing"


def test_limits_of_the_session_are_documented_numbers():
    """The bounds the tests above rely on, as the docs state them."""
    lim = Limits(memory_mb=128, disk_mb=32)
    assert session_inodes(lim) == max(4096, lim.disk_bytes // 4096)
    assert session_carry(lim) == lim.disk_bytes + session_inodes(lim) * 1024
    assert socket_bytes(lim) == 32 * MiB


def test_a_an_episode_that_breaks_its_workspace_does_not_lose_the_batch(runner):
    """Turn one of an agent episode makes main.py a directory; its next turn is a
    candidate outcome and the batch (with another episode) comes back (before: the
    UsageError raised out of rollout() and lost every episode of the batch)."""
    from trialbox.rollout.agent import AgentConfig, rollout
    from trialbox.rollout.policy import ScriptedPolicy
    from trialbox.schedule.lease import DirectLeaser
    from trialbox.types import Task, TaskKind, TestCase

    add = Task(task_id="add", kind=TaskKind.STDIO, prompt="Read two integers; print their sum.",
               visible_tests=(TestCase("v", stdin=b"2 3\n", expected=b"5\n"),),
               hidden_tests=(TestCase("h", stdin=b"40 2\n", expected=b"42\n"),))
    breaker = ("```python\nimport os\nos.remove('main.py')\nos.mkdir('main.py')\n```")
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"

    def script(prompt: str, turn: int) -> str:
        return breaker if turn == 0 and "BREAK" in prompt else right

    async def opener(lim):
        return await NamespaceSandbox.open(runner.pool, lim)
    tasks = [add, Task(task_id="add-break", kind=TaskKind.STDIO,
                       prompt=add.prompt + " BREAK", visible_tests=add.visible_tests,
                       hidden_tests=add.hidden_tests)]
    batch = runner.run(rollout(ScriptedPolicy(script), tasks, max_turns=2,
                               config=AgentConfig(max_new_tokens=400), pool=runner.pool,
                               leaser=DirectLeaser(opener)))
    by_task = {t.task_id: t for t in batch.trajectories}
    assert by_task["add"].passed and by_task["add-break"].reward is not None
    assert all(t.reward is not None for t in batch.trajectories)
