"""Class K of issue 28: what sandboxes share with the host and with each other, on the
real tiers (docs/adversary.md, section K): the uid leases on the namespace tier, the
runtime's inodes and host-wide flushes on every tier (namespace on both cell paths,
container with runc and crun, gvisor).

Two kinds of sharing, each an attack a red team ran against main before the fix:

* per-user kernel budgets: sessions of two processes that each start a pool ran as the
  same host uid (both pools counted from one base), so one session shrank the other's
  pipes. Host uids are now leased per node (uids.py).
* the runtime's inodes: /usr, the root template and the /dev nodes were the host's (or
  the pool's or provider's) own inodes, so inotify watched other sessions' and the
  host's opens, flock passed bits between sessions, fadvise(DONTNEED) emptied the host's
  page cache of the runtime and sync() flushed every host filesystem. The namespace
  tier's cells got overlays of their own first (2208c9c), the container tier's
  containers after.
"""

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

from tests.adversarial.tiers import Tier
from tests.conftest import load_scaled
from tests.sandbox.conftest import limits

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ------------------------------------------------ class 2: a host uid per session, node-wide

POOL_PROCESS = textwrap.dedent("""
    import asyncio, json, sys
    from trialbox.sandbox import run_code
    from trialbox.sandbox.pool import CellPool, PoolConfig

    async def main(grid, lease_dir, sessions, hold):
        if grid:
            from trialbox.sandbox import uids
            uids.NODE_BASE, uids.MAX_UID = grid, grid + 16 * uids.BLOCK
        config = PoolConfig(warm=1, **({"uid_lease_dir": lease_dir} if lease_dir else {}))
        pool = await CellPool(config).start()
        seen, held = [], []
        for _ in range(sessions):
            sb = await pool.open()
            held.append(sb)
            # the host uid the candidate runs as: its user namespace's map, read inside
            r = await run_code(sb, "print(open('/proc/self/uid_map').read().split()[1])")
            seen.append(int(r.stdout))
        if hold:  # a run in flight when the process is killed
            task = asyncio.ensure_future(held[0].exec(["sleep", "600"]))
            await asyncio.sleep(0.3)
        print(json.dumps(seen), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for sb in held:
            await sb.close()
        await pool.close()

    asyncio.run(main(*json.loads(sys.argv[1])))
""")


def _pool_process(grid=0, lease_dir="", sessions=3, hold=False):
    """A separate process that starts a pool, opens `sessions` sessions and prints the
    host uids their candidates ran as; it holds them until its stdin closes."""
    p = subprocess.Popen([sys.executable, "-c", POOL_PROCESS,
                          json.dumps([grid, lease_dir, sessions, hold])],
                         cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = p.stdout.readline()
    assert line, f"the pool process failed (exit {p.wait()})"
    return p, json.loads(line)


def _end(p):
    if p.poll() is None:
        p.stdin.close()
        try:
            p.wait(timeout=load_scaled(30))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    p.stdout.close()


def test_two_processes_pools_never_share_a_host_uid():
    """Two processes on one node, each with a pool, sessions live in both at once: no
    host uid in common (before: both handed out 1000000, 1000001, ...)."""
    a, uids_a = _pool_process()
    try:
        b, uids_b = _pool_process()
        try:
            assert len(set(uids_a)) == len(uids_a) and len(set(uids_b)) == len(uids_b)
            assert not set(uids_a) & set(uids_b), (uids_a, uids_b)
            assert all(u >= 65_536 for u in uids_a + uids_b)
        finally:
            _end(b)
    finally:
        _end(a)


def _running_as(lo, hi):
    out = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/status") as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if any(lo <= int(u) < hi for u in uid_line.split()[1:]):
            out.append(int(name))
    return out


def test_a_killed_pool_process_gives_its_uids_back(tmp_path):
    """SIGKILL to a process whose pool has a run in flight: once its sandboxes are gone,
    the next pool on the node gets the same uids (a private grid, far above every uid
    in use, so other pools on this machine cannot take them first)."""
    from trialbox.sandbox.uids import BLOCK
    grid, leases = 900_000_000, str(tmp_path / "leases")
    a, uids_a = _pool_process(grid, leases, sessions=1, hold=True)
    assert grid <= uids_a[0] < grid + BLOCK
    assert _running_as(grid, grid + BLOCK), "the run in flight should run as the lease"
    a.send_signal(signal.SIGKILL)
    a.wait()
    a.stdout.close()
    a.stdin.close()
    deadline = time.monotonic() + load_scaled(30)
    while _running_as(grid, grid + BLOCK) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running_as(grid, grid + BLOCK), "the killed pool's sandboxes outlived it"
    c, uids_c = _pool_process(grid, leases, sessions=1)
    try:
        assert grid <= uids_c[0] < grid + BLOCK, (uids_a, uids_c)
    finally:
        _end(c)


# ------------------------------------------- class 1: the runtime's inodes are the cell's

RUNTIME_PATHS = ["/usr/bin/true", "/etc/hostname", "/dev/null", "/proc/self/exe"]
"""One of each kind a sandbox sees: the runtime (/usr), the root template, a device
node, and the interpreter every Python candidate runs in."""

CLASS1_TIERS = ["namespace", "namespace:python", "container", "container:crun", "gvisor"]


@pytest.fixture(scope="module", params=CLASS1_TIERS)
def tier(request: pytest.FixtureRequest) -> Iterator[Tier]:
    t = Tier(request.param)
    yield t
    t.close()


def _host_paths(tier):
    """The host's files behind RUNTIME_PATHS: what a sandbox's were before the fix (its
    /dev/null: the host's on the namespace tier, the provider's nodes on the container
    tier; both are here), and the tier's device nodes."""
    paths = ["/usr/bin/true", os.path.join(tier.template, "etc/hostname"), "/dev/null",
             tier.python]
    if tier.dev_nodes is not None:
        paths.append(os.path.join(tier.dev_nodes, "null"))
    return paths


async def _while_held(tier, code, during):
    """Run `code` in a session; once it writes a byte on fd 3 (its set-up is done), run
    `during()` (the host and a sibling session acting), then answer so it finishes."""
    import asyncio
    import socket
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    loop = asyncio.get_running_loop()
    async with await tier.provider.open(limits(wall_s=load_scaled(20))) as sb:
        task = asyncio.ensure_future(
            sb.exec(["python3", "-c", code], pass_fds={3: theirs.fileno()}))
        theirs.detach()  # the sandbox owns it now
        try:
            ready = await asyncio.wait_for(loop.sock_recv(ours, 1), load_scaled(15))
            assert ready == b"r", (await task).stderr
            seen = await during()
            await loop.sock_sendall(ours, b"g")
        finally:
            result = await task
            ours.close()
    return result, seen


async def _sibling(tier, code):
    from trialbox.sandbox import run_code
    async with await tier.provider.open(limits()) as sb:
        return await run_code(sb, code)


WATCHER = """
import ctypes, json, os, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
wds = {}
for p in %r:
    wd = libc.inotify_add_watch(fd, p.encode(), 0x1 | 0x2 | 0x20)  # ACCESS|MODIFY|OPEN
    assert wd >= 0, (p, os.strerror(ctypes.get_errno()))
    wds[wd] = p
own = os.open('mine.txt', os.O_CREAT | os.O_WRONLY)
wds[libc.inotify_add_watch(fd, b'mine.txt', 0x2)] = 'mine.txt'
os.write(3, b'r')
os.read(3, 1)
os.write(own, b'x')  # its own file: the watch works
seen, buf = dict.fromkeys(wds.values(), 0), b''
try:
    while True:
        buf += os.read(fd, 65536)
except BlockingIOError:
    pass
i = 0
while i < len(buf):
    wd, mask, cookie, n = struct.unpack_from('iIII', buf, i)
    i += 16 + n
    seen[wds.get(wd, 'overflow')] = seen.get(wds.get(wd, 'overflow'), 0) + 1
print(json.dumps(seen))
""" % (RUNTIME_PATHS,)


def test_inotify_on_the_runtime_sees_neither_the_host_nor_other_sessions(tier):
    """A watch on /usr/bin/true, /etc/hostname, /dev/null and /proc/self/exe while the
    host and a sibling session open, read, write and exec them: no event (before: every
    one of them, a live list of what others run). A watch on its own file still works."""
    def host_acts():
        with open("/usr/bin/true", "rb") as f:
            f.read(64)
        subprocess.run(["/usr/bin/true"], check=True)
        with open(os.path.join(tier.template, "etc/hostname")) as f:
            f.read()
        for dev in _host_paths(tier)[4:] + ["/dev/null"]:
            with open(dev, "w") as f:
                f.write("x")
        subprocess.run([tier.python, "-I", "-c", "pass"], check=True)

    async def during():
        host_acts()
        return await _sibling(tier, "for p in %r:\n"
                                      "    open(p, 'rb').read(64)\n"
                                      "open('/dev/null', 'w').write('x')\n"
                                      % (RUNTIME_PATHS,))
    r, sibling = tier.run(_while_held(tier, WATCHER, during))
    assert sibling.status.value == "ok", sibling.stderr
    assert r.status.value == "ok", r.stderr[-2000:]
    seen = json.loads(r.stdout)
    assert seen.pop("mine.txt") >= 1, seen
    assert seen == dict.fromkeys(RUNTIME_PATHS, 0), seen


LOCKER = """
import errno, fcntl, json, os, struct
held, got = [], {}
def lock(p, how):
    fd = os.open(p, os.O_RDONLY)
    held.append(fd)
    try:
        how(fd)
        return 'held'
    except OSError as e:  # gVisor: no OFD locks, no flock on a device
        return errno.errorcode[e.errno]
for p in %r:
    got[p] = [lock(p, lambda fd: fcntl.flock(fd, fcntl.LOCK_EX)),
              lock(p, lambda fd: fcntl.fcntl(fd, 37,  # F_OFD_SETLK
                                             struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0)))]
os.write(3, b'r')
os.read(3, 1)
print(json.dumps(got))
""" % (RUNTIME_PATHS,)

PROBE = """
import errno, fcntl, json, os, struct
def probe(paths):
    out = {}
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fl = 'free'
        except BlockingIOError:
            fl = 'held'
        except OSError as e:
            fl = errno.errorcode[e.errno]
        try:
            r = fcntl.fcntl(fd, 36, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))
            ofd = 'free' if struct.unpack('hhqqi4x', r)[0] == fcntl.F_UNLCK else 'held'
        except OSError as e:  # F_OFD_GETLK
            ofd = errno.errorcode[e.errno]
        os.close(fd)
        out[p] = [fl, ofd]
    return out
"""


def test_flock_and_ofd_locks_on_the_runtime_reach_no_one(tier):
    """One session holds flock and OFD locks on the runtime's files; a concurrent
    session and the host find every one of them free (before: held — a covert channel
    between sessions, and a way to block host tools that lock those files). gVisor
    refuses OFD locks (EINVAL) and flock on a device (ENOLCK): nothing to share."""
    async def during():
        scope: dict = {}
        exec(PROBE, scope)
        host = scope["probe"](_host_paths(tier))
        sib = await _sibling(tier, PROBE + "print(json.dumps(probe(%r)))" % (RUNTIME_PATHS,))
        return host, sib
    r, (host, sib) = tier.run(_while_held(tier, LOCKER, during))
    assert r.status.value == "ok", r.stderr[-2000:]
    assert sib.status.value == "ok", sib.stderr[-2000:]
    got, seen = json.loads(r.stdout), json.loads(sib.stdout)
    if tier.kind == "gvisor":
        refused = {p: [v if v != "held" else "free" for v in got[p]] for p in RUNTIME_PATHS}
        assert seen == refused, (got, seen)
    else:
        assert got == {p: ["held", "held"] for p in RUNTIME_PATHS}, got
        assert seen == {p: ["free", "free"] for p in RUNTIME_PATHS}, seen
    assert host == {p: ["free", "free"] for p in _host_paths(tier)}


def _cached_pages(path):
    """Pages of `path` in the host's page cache (mincore over a fresh mapping)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    try:
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        return sum(b & 1 for b in vec)
    finally:
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))


RUNTIME_FILE = "/usr/lib/python3.11/pydoc_data/topics.py"
"""A runtime file of ~0.7 MiB that nothing keeps mapped (its pages can be dropped)."""


def test_fadvise_dontneed_leaves_the_hosts_page_cache_alone(tier):
    """posix_fadvise(DONTNEED) over a runtime file the host has cached: it returns 0 and
    the host's pages stay (before: all of them dropped — the flush of flush+reload)."""
    with open(RUNTIME_FILE, "rb") as f:
        f.read()
    before = _cached_pages(RUNTIME_FILE)
    r = tier.one("import os\n"
                "for p in (%r, '/proc/self/exe'):\n"
                "    fd = os.open(p, os.O_RDONLY)\n"
                "    print(os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))\n"
                % (RUNTIME_FILE,))
    after = _cached_pages(RUNTIME_FILE)
    assert r.status.value == "ok" and r.stdout == b"None\nNone\n", r.stderr[-2000:]
    assert before > 0
    assert after >= before * 0.9, (before, after)


def _dirty_pages(path):
    """Dirty pages of `path` (cachestat(2), read on the host)."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    rng = ctypes.create_string_buffer(struct.pack("QQ", 0, 0))
    out = ctypes.create_string_buffer(40)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert libc.syscall(451, fd, rng, out, 0) == 0, ctypes.get_errno()
    finally:
        os.close(fd)
    return struct.unpack("5Q", out.raw)[1]


SYNCER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.sync()
fd = os.open('/usr/bin/true', os.O_RDONLY)
print(libc.syncfs(fd), libc.sync())
"""


def test_sync_from_a_sandbox_writes_back_nothing_of_the_host(tier, tmp_path):
    """A host file with dirty pages (on the host's disk); the sandbox calls sync() and
    syncfs() on a runtime file: both return 0 and the host file is still dirty (before:
    written back — every host filesystem flushed, charged to nobody). Tried up to three
    times: a sync by anyone else on the host in between is not the sandbox's."""
    path = tmp_path / "dirty"
    for _ in range(3):
        with open(path, "wb") as f:
            f.write(os.urandom(1 << 20))
        if _dirty_pages(path) == 0:
            continue  # written back before the sandbox ran: try again
        r = tier.one(SYNCER)
        assert r.status.value == "ok" and r.stdout == b"0 0\n", r.stderr[-2000:]
        if _dirty_pages(path) > 0:
            return
    raise AssertionError("the host file's pages were written back each time")


ORDINARY = """
import fcntl, os, sqlite3, sys
# sqlite locks its own files: a second writer is refused while the first holds it
a = sqlite3.connect('db.sqlite', timeout=0)
a.execute('create table t (x)')
a.commit()
a.execute('begin immediate')
a.execute('insert into t values (1)')
b = sqlite3.connect('db.sqlite', timeout=0)
try:
    b.execute('insert into t values (2)')
    print('not locked')
except sqlite3.OperationalError as e:
    print(e)
a.commit()
b.execute('insert into t values (2)')
b.commit()
print(sorted(r[0] for r in a.execute('select x from t')))
# flock between two processes on its own file
fd = os.open('lock', os.O_CREAT | os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
pid = os.fork()
if pid == 0:
    try:
        fcntl.flock(os.open('lock', os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)
        os._exit(1)
    except BlockingIOError:
        os._exit(0)
print('child blocked:', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0)
# fsync, sync and fadvise on its own files
f = os.open('data', os.O_CREAT | os.O_WRONLY)
os.write(f, b'x' * 10000)
print(os.fsync(f), os.fdatasync(f), os.sync(),
      os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED),
      os.posix_fadvise(f, 0, 0, os.POSIX_FADV_WILLNEED), open('data').read(3))
print(os.readlink('/proc/self/exe'), os.path.realpath(sys.executable))
"""


def test_ordinary_programs_still_work(tier):
    """What programs do with their own files: sqlite's locks, flock between two of its
    processes, fsync/sync/fadvise, the interpreter's /proc/self/exe, and gcc."""
    r = tier.one(ORDINARY)
    assert r.status.value == "ok", r.stderr[-2000:]
    lines = r.stdout.decode().splitlines()
    assert lines[:3] == ["database is locked", "[1, 2]", "child blocked: True"], lines
    assert lines[3] == "None None None None None xxx", lines
    exe, real = lines[4].split()
    assert exe == real and exe.startswith("/usr/bin/python3"), lines
    c = tier.one('#include <stdio.h>\nint main(void){printf("%d\\n", 6 * 7);}\n', "c")
    assert (c.status.value, c.stdout) == ("ok", b"42\n"), c.stderr[-2000:]
    sh = tier.one("import subprocess\n"
                 "print(subprocess.run(['python3', '-c', 'import json; print(json.dumps(1))'],"
                 " capture_output=True, text=True).stdout.strip())\n")
    assert (sh.status.value, sh.stdout) == ("ok", b"1\n"), sh.stderr[-2000:]


UEVENT = """
import errno, json, os, select, socket
out = {}
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15)  # NETLINK_KOBJECT_UEVENT
    s.bind((0, 1))
except OSError as e:
    s, out['refused'] = None, errno.errorcode[e.errno]
os.write(3, b'r')
os.read(3, 1)
if s is not None:
    ready = select.select([s], [], [], 2)[0]
    out['event'] = s.recv(4096)[:40].decode(errors='replace') if ready else None
route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE: libc's
out['route'] = route.fileno() > 0
out['ifaddrs'] = [n for _, n in socket.if_nameindex()]
print(json.dumps(out))
"""


def test_a_uevent_socket_is_refused_and_netlink_route_works(tier):
    """NETLINK_KOBJECT_UEVENT is refused (EPROTONOSUPPORT) while the host makes a device
    event (before: the socket bound, and the host's `change` on /dev/null arrived — the
    cells' network namespaces belong to the host's user namespace, and uevents go to all
    of those). NETLINK_ROUTE, which libc uses, still works."""
    async def during():
        with open("/sys/devices/virtual/mem/null/uevent", "w") as f:
            f.write("change")
    r, _ = tier.run(_while_held(tier, UEVENT, during))
    assert r.status.value == "ok", r.stderr[-2000:]
    assert json.loads(r.stdout) == {"refused": "EPROTONOSUPPORT", "route": True,
                                    "ifaddrs": ["lo"]}, r.stdout


STDIN_WATCHER = """
import ctypes, fcntl, json, os
libc = ctypes.CDLL(None, use_errno=True)
fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK | os.O_APPEND)
fd = libc.inotify_init1(os.O_NONBLOCK)
assert libc.inotify_add_watch(fd, b'/proc/self/fd/0', 0x1 | 0x2 | 0x20) >= 0
os.write(3, b'r')
os.read(3, 1)
try:
    n = len(os.read(fd, 65536))
except BlockingIOError:
    n = 0
print(json.dumps({'events': n, 'eof': os.read(0, 10) == b''}))
"""


def test_a_runs_empty_stdin_is_its_own(tier):
    """A run without input: its stdin is a file of its own (before: a dup of the pool's
    one open host /dev/null, so a watch on /proc/self/fd/0 saw the host's writes to
    /dev/null, and flags set on it with F_SETFL showed in every other session's stdin)."""
    async def during():
        with open("/dev/null", "w") as f:
            f.write("x")
        return await _sibling(tier, "import fcntl, os\n"
                                      "print(bool(fcntl.fcntl(0, fcntl.F_GETFL)"
                                      " & (os.O_NONBLOCK | os.O_APPEND)), os.read(0, 9))\n")
    r, sibling = tier.run(_while_held(tier, STDIN_WATCHER, during))
    assert r.status.value == "ok", r.stderr[-2000:]
    assert json.loads(r.stdout) == {"events": 0, "eof": True}, r.stdout
    assert (sibling.status.value, sibling.stdout) == ("ok", b"False b''\n"), sibling.stderr
