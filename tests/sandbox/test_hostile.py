"""Hostile programs against the namespace tier: each is contained, gets the right status,
and leaves the host as it found it (no process, cgroup or mount left behind).

The only network address outside this machine touched here is one connect attempt to
1.1.1.1:53, which must fail; everything else stays on loopback.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
from typing import Any

import pytest

import trialbox
from tests.conftest import load_scaled
from tests.sandbox.conftest import CANDIDATE_STATUSES, FAST, RunOne, describe, no_leaks
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.types import ExecStatus

SECRET = "tb-secret-7f3a9c2e"
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(trialbox.__file__))).encode()
"""The host's project tree (e.g. /work/main): never visible, never named, inside."""


def assert_host_fine(runner) -> None:
    """The host still forks, the pool still serves a good run, nothing leaked."""
    assert subprocess.run(["/bin/true"], check=False, timeout=10).returncode == 0

    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
            return await run_code(sb, "print(sum(range(10)))")
    r = runner.run(body())
    assert (r.status, r.stdout) == (ExecStatus.OK, b"45\n"), describe(r)
    no_leaks(runner)


# ------------------------------------------------------------------ resource attacks

SPLIT_HOG = """
import os, sys, time
def hog():
    b = bytearray(30 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    time.sleep(1)
    return b
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        hog()
        os._exit(0)
    kids.append(pid)
hog()
sys.exit(1 if any(os.waitpid(k, 0)[1] for k in kids) else 0)
"""
"""Four processes of 30 MB each: only the cgroup's total is over a 64 MB limit."""

RESOURCE_ATTACKS = [
    # id, lang, code, limit changes, status, the limit (a Limits field) that ends it
    # the fork bombs' CPU limit out of reach (32 processes burn CPU retrying): the wall
    # limit ends them, with the pids limit holding meanwhile
    ("fork-bomb-bash", "bash", ":(){ :|:& };:\nsleep 30",
     {"wall_s": 1.5, "cpu_s": 60, "pids": 32}, ExecStatus.TIMEOUT, "wall_s"),
    ("fork-bomb-python", "python",
     ("import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
      "        time.sleep(0.01)"), {"wall_s": 1.5, "cpu_s": 60, "pids": 32},
     ExecStatus.TIMEOUT, "wall_s"),
    ("memory-bomb", "python", "b = []\nwhile True:\n    b.append(b'x' * 10**7)",
     {"memory_mb": 64}, ExecStatus.MEMORY, "memory_mb"),
    ("memory-bomb-split", "python", SPLIT_HOG, {"memory_mb": 64, "wall_s": 3},
     ExecStatus.MEMORY, "memory_mb"),
    ("disk-fill", "bash", "head -c 1G /dev/zero > fill", {"disk_mb": 16}, ExecStatus.DISK,
     "disk_mb"),
    ("disk-fill-shm", "python",
     "f = open('/dev/shm/fill', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))",
     {"disk_mb": 16}, ExecStatus.DISK, "disk_mb"),
    # a wall limit out of reach however loaded the host: the CPU limit must end it
    ("cpu-spin", "python", "while True:\n    pass", {"cpu_s": 1, "wall_s": 60},
     ExecStatus.TIMEOUT, "cpu_s"),
    ("sleep-forever", "bash", "sleep infinity", {"wall_s": 1}, ExecStatus.TIMEOUT, "wall_s"),
    ("stdout-flood-gigabytes", "bash", "head -c 8G /dev/zero", {"wall_s": 10},
     ExecStatus.OUTPUT, "output_bytes"),
]
"""Each attack ends by the limit named, with its status and a message naming that limit:
contained by what was meant to contain it, which no wall-time bound could show on a
loaded host. (A run that outlived its kill would be `infra`, the supervisor's.)"""


def load_scaled_wall(changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` with its wall limit load-scaled: a wall limit here either ends a run
    that would go on for ever, at any value, or must not end one before the limit meant
    to (the pids, memory or output limit), however slow the loaded host makes it."""
    if "wall_s" not in changes:
        return changes
    return {**changes, "wall_s": load_scaled(changes["wall_s"])}


@pytest.mark.parametrize("lang, code, changes, want, limit",
                         [a[1:] for a in RESOURCE_ATTACKS], ids=[a[0] for a in RESOURCE_ATTACKS])
def test_resource_attack_contained(run_one: RunOne, runner, lang, code, changes, want, limit):
    r = run_one(code, lang, **load_scaled_wall(changes))
    assert r.status in CANDIDATE_STATUSES, describe(r)
    assert r.status is want, describe(r)
    assert f"Limits.{limit}" in r.message, describe(r)
    if want is ExecStatus.OUTPUT:
        assert r.truncated and len(r.stdout) == FAST.output_bytes
    if want is ExecStatus.MEMORY:
        assert r.peak_memory_bytes <= (changes["memory_mb"] + 8) << 20
    assert_host_fine(runner)


def test_fork_bomb_hits_the_pids_limit(run_one: RunOne, runner):
    """The bomb really ran into pids.max (fork failed with EAGAIN) and never got more
    than `pids` processes: the count each process sees is bounded."""
    code = ("import os, time\nsaid = False\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError as e:\n        if not said:\n            said = True\n"
            "            n = sum(1 for p in os.listdir('/proc') if p.isdigit())\n"
            "            os.write(1, b'%d %d\\n' % (e.errno, n))\n        time.sleep(0.01)")
    r = run_one(code, wall_s=load_scaled(1.5), pids=16)  # room to reach the cap: it prints
    assert r.status is ExecStatus.TIMEOUT, describe(r)
    lines = r.stdout.split()
    assert lines, describe(r)
    pairs = [(int(a), int(b)) for a, b in zip(lines[::2], lines[1::2], strict=True)]
    assert all(e == errno.EAGAIN for e, _ in pairs), pairs
    # the candidate's processes (+ init, which is outside the cgroup) never pass the cap
    assert max(n for _, n in pairs) <= 16 + 1, pairs
    assert_host_fine(runner)


# ------------------------------------------------------------------ network


def test_no_route_to_host_loopback_listener(runner):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    abstract = f"\0trialbox-test-{os.getpid()}"
    usrv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    usrv.bind(abstract)
    usrv.listen(8)
    usrv.setblocking(False)
    code = f"""
import socket
out = {{}}
for name, fam, addr in [("tcp", socket.AF_INET, ("127.0.0.1", {port})),
                        ("unix", socket.AF_UNIX, {abstract!r})]:
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(addr)
        s.sendall(b"escaped")
        out[name] = "connected"
    except OSError as e:
        out[name] = e.errno
print(out)
"""
    try:
        async def body():
            async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
                return await run_code(sb, code)
        r = runner.run(body())
        assert r.status is ExecStatus.OK, describe(r)
        assert r.stdout == f"{{'tcp': {errno.ECONNREFUSED}, 'unix': {errno.ECONNREFUSED}}}\n"\
            .encode(), describe(r)
        for s in (srv, usrv):
            with pytest.raises(BlockingIOError):
                s.accept()
    finally:
        srv.close()
        usrv.close()
    no_leaks(runner)


def test_no_external_network(run_one: RunOne):
    """One connect attempt outside (must fail at once: no route) and a name lookup."""
    code = """
import socket
s = socket.socket()
s.settimeout(1)
try:
    s.connect(("1.1.1.1", 53))
    print("connected")
except OSError as e:
    print("connect", type(e).__name__)
try:
    socket.getaddrinfo("example.com", 80)
    print("resolved")
except OSError as e:
    print("resolve", type(e).__name__)
print(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
"""
    r = run_one(code)
    # Nothing waited: the run ended under its wall limit (a lookup that waited for a
    # nameserver would not), and the connect failed at once (its 1 s timeout would
    # read `TimeoutError`, not `OSError`).
    assert r.status is ExecStatus.OK, describe(r)
    assert b"connected" not in r.stdout and b"resolved" not in r.stdout, describe(r)
    assert r.stdout.startswith(b"connect OSError\nresolve "), describe(r)
    assert r.stdout.endswith(b"['lo']\n"), describe(r)  # no interface but loopback


# ------------------------------------------------------------------ host secrets


def test_host_files_not_visible(run_one: RunOne):
    script = r"""
for p in /etc/shadow /etc/gshadow /root /home PROJECT /run /run/trialbox \
         /var/log /sys /dev/vda /dev/sda /dev/mem /dev/kmsg /etc/ssh /etc/sudoers; do
    if [ -e "$p" ] || [ -L "$p" ]; then echo "VISIBLE $p"; fi
done
ls /dev | tr '\n' ' '; echo
ls / | tr '\n' ' '; echo
cat /etc/passwd
"""
    r = run_one(script.replace("PROJECT", PROJECT.decode()), "bash")
    assert r.status is ExecStatus.OK, describe(r)
    assert b"VISIBLE" not in r.stdout, describe(r)
    lines = r.stdout.decode().splitlines()
    assert set(lines[0].split()) <= {"null", "zero", "full", "random", "urandom", "fd",
                                     "stdin", "stdout", "stderr", "shm", "pts", "ptmx",
                                     "tty"}, lines[0]
    assert "work" not in lines[1].split() and "root" not in lines[1].split()
    users = [line.split(":")[0] for line in lines[2:]]
    assert set(users) <= {"root", "sandbox", "nobody"}, users  # not the host's passwd


def test_parent_environment_not_visible(runner, monkeypatch):
    monkeypatch.setenv("TRIALBOX_SECRET", SECRET)
    script = ("env; echo ---; for f in /proc/[0-9]*/environ /proc/self/environ "
              "/proc/[0-9]*/cmdline; do cat \"$f\" 2>/dev/null | tr '\\0' '\\n'; done; "
              "echo ---; cat /proc/1/environ; echo rc=$?")

    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
            return await sb.exec(["/bin/bash", "-c", script])
    r = runner.run(body())
    assert r.status is ExecStatus.OK, describe(r)
    assert SECRET.encode() not in r.stdout + r.stderr
    assert b"TRIALBOX" not in r.stdout, describe(r)
    assert r.stdout.endswith(b"rc=1\n"), "pid 1's environment must not be readable"
    no_leaks(runner)


def test_host_processes_not_visible(runner):
    """The sandbox sees only its own processes: not the host's, not pytest, not another
    session running at the same time."""
    import asyncio

    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as a, \
                await NamespaceSandbox.open(runner.pool, FAST) as b:
            busy = asyncio.ensure_future(a.exec(["/bin/bash", "-c", "sleep 1.2; echo a"]))
            await asyncio.sleep(0.3)
            seen = await b.exec(["/bin/bash", "-c",
                                 ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; "
                                  "echo; done")])
            return await busy, seen
    busy, seen = runner.run(body())
    assert busy.stdout == b"a\n", describe(busy)
    assert seen.status is ExecStatus.OK, describe(seen)
    cmdlines = [c for c in seen.stdout.decode().splitlines() if c.strip()]
    assert len(cmdlines) <= 4, cmdlines  # init, bash, (tr), and nothing else
    assert not any("sleep" in c or "pytest" in c for c in cmdlines), cmdlines
    no_leaks(runner)


def test_project_path_not_revealed(run_one: RunOne):
    """Nothing the candidate can read names the host's project tree: not a Python
    traceback, not /proc (command lines, maps, environments, mounts)."""
    r = run_one("def f():\n    1 / 0\nf()")
    assert r.status is ExecStatus.EXIT, describe(r)
    assert b"ZeroDivisionError" in r.stderr
    assert PROJECT not in r.stderr, r.stderr.decode()
    r = run_one("cat /proc/[0-9]*/cmdline /proc/[0-9]*/maps /proc/[0-9]*/environ "
                "/proc/self/mountinfo 2>/dev/null | tr '\\0' ' '", "bash")
    assert r.status is ExecStatus.OK, describe(r)
    assert PROJECT not in r.stdout, r.stdout.decode()


# ------------------------------------------------------------------ writing outside


def test_writes_outside_workspace_fail(run_one: RunOne, runner):
    script = r"""
for d in /usr /usr/bin /etc / /bin /lib /proc/sys /dev /workspace /tmp /dev/shm; do
    if (echo x > "$d/.tb_probe") 2>/dev/null; then echo "$d writable"; fi
done
[ -w /proc/sys/kernel/panic ] && echo "sysctl writable"
(echo x >> /dev/null) && echo "devnull ok"
"""
    r = run_one(script, "bash")
    assert r.status is ExecStatus.OK, describe(r)
    assert r.stdout == b"/workspace writable\n/tmp writable\n/dev/shm writable\ndevnull ok\n"
    for d in ("/usr", "/usr/bin", "/etc", "/", "/bin", "/lib"):
        assert not os.path.exists(os.path.join(d, ".tb_probe"))
    no_leaks(runner)


def test_leftovers_do_not_reach_the_next_session(runner):
    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as a:
            r = await a.exec(["/bin/bash", "-c",
                              ("echo trap > /tmp/.trap; echo trap > /dev/shm/.trap; "
                               "echo 'echo pwned' > /workspace/.bashrc; mkfifo /tmp/fifo")])
            assert r.status is ExecStatus.OK, describe(r)
        async with await NamespaceSandbox.open(runner.pool, FAST) as b:
            return await b.exec(["/bin/bash", "-c",
                                 "ls -A /tmp /dev/shm /workspace; cat /tmp/.trap; exit 0"])
    r = runner.run(body())
    assert r.status is ExecStatus.OK, describe(r)
    assert b"trap" not in r.stdout and b"pwned" not in r.stdout, describe(r)
    no_leaks(runner)


# ------------------------------------------------------------------ processes


def test_kill_everything_spares_the_host(runner):
    """`kill -9 -1` and a sweep over every pid number from inside: the sandbox may kill
    its own processes, never a host process (one runs here as another uid) or the pool."""
    host = subprocess.Popen(["/bin/sleep", "30"], user=65534)
    try:
        async def body():
            async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
                r1 = await sb.exec(["/bin/bash", "-c",
                                    "sleep 30 & kill -9 -1; wait; echo survived"])
                r2 = await sb.exec(["/bin/bash", "-c",
                                    (f"for p in $(seq 1 5000) {host.pid} {os.getpid()}; do "
                                    "kill -9 $p 2>/dev/null; done; echo swept")])
                return r1, r2
        r1, r2 = runner.run(body())
        assert (r1.status, r1.stdout) == (ExecStatus.OK, b"survived\n"), describe(r1)
        assert r2.status in CANDIDATE_STATUSES, describe(r2)
        assert host.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        host.kill()
        host.wait()
    assert_host_fine(runner)


def test_ptrace_denied(run_one: RunOne):
    code = r"""
import ctypes, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
out = {}
for name, pid in (("init", 1), ("parent", os.getppid())):
    out[name] = (libc.ptrace(PTRACE_ATTACH, pid, 0, 0), ctypes.get_errno())
child = os.fork()
if child == 0:
    time.sleep(5)
    os._exit(0)
out["own-child"] = (libc.ptrace(PTRACE_SEIZE, child, 0, 0), ctypes.get_errno())
iov = (ctypes.c_char * 8)()
local = (ctypes.c_void_p * 2)(ctypes.addressof(iov), 8)
out["vm_readv"] = (libc.process_vm_readv(1, local, 1, local, 1, 0), ctypes.get_errno())
os.kill(child, 9)
print(json.dumps(out))
"""
    r = run_one(code)
    assert r.status is ExecStatus.OK, describe(r)
    got = json.loads(r.stdout)
    assert got == {k: [-1, errno.EPERM] for k in ("init", "parent", "own-child", "vm_readv")}


PRIVILEGED = {
    # name: (x86_64 number, args) — arguments chosen to be harmless even if allowed
    "mount": (165, [b"none", b"/tmp", b"tmpfs", 0, None]),
    "umount2": (166, [b"/workspace", 2]),
    "unshare-user": (272, [0x10000000]),
    "unshare-net": (272, [0x40000000]),
    "clone-newuser": (56, [0x10000000 | 17, 0, 0, 0, 0]),
    "setns": (308, [0, 0]),
    "pivot_root": (155, [b"/tmp", b"/tmp"]),
    "chroot": (161, [b"/tmp"]),
    "keyctl": (250, [0, 0, 0]),
    "add_key": (248, [b"user", b"k", b"v", 1, -2]),
    "bpf": (321, [0, 0, 0]),
    "perf_event_open": (298, [0, 0, -1, -1, 0]),
    "reboot": (169, [0xFEE1DEAD, 672274793, 0, 0]),  # LINUX_REBOOT_CMD_CAD_OFF
    "sethostname": (170, [b"pwned", 5]),
    "init_module": (175, [0, 0, b""]),
    "kexec_load": (246, [0, 0, 0, 0]),
    "syslog": (103, [3, 0, 0]),
    "io_uring_setup": (425, [1, 0]),
    "userfaultfd": (323, [0]),
    "open_by_handle_at": (304, [0, 0, 0]),
    "swapon": (167, [b"/tmp/x", 0]),
    "settimeofday": (164, [0, 0]),
}


def test_privileged_syscalls_fail_with_eperm(run_one: RunOne):
    code = f"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
for name, (nr, args) in {PRIVILEGED!r}.items():
    ctypes.set_errno(0)
    out[name] = (libc.syscall(nr, *args), ctypes.get_errno())
print(json.dumps(out))
"""
    r = run_one(code)
    assert r.status is ExecStatus.OK, describe(r)
    got = json.loads(r.stdout)
    bad = {k: v for k, v in got.items() if v != [-1, errno.EPERM]}
    assert not bad, f"not refused with EPERM: {bad}"
    assert set(got) == set(PRIVILEGED)


def test_identity_without_privilege(run_one: RunOne):
    r = run_one("id -u; id -g; id -G; grep -E '^(Cap(Inh|Prm|Eff|Amb)|NoNewPrivs|Seccomp):' "
                "/proc/self/status", "bash")
    assert r.status is ExecStatus.OK, describe(r)
    lines = r.stdout.decode().splitlines()
    assert lines[:3] == ["1000", "1000", "1000"], lines
    fields = dict(line.split(":\t") for line in lines[3:])
    assert fields == {"CapInh": "0000000000000000", "CapPrm": "0000000000000000",
                      "CapEff": "0000000000000000", "CapAmb": "0000000000000000",
                      "NoNewPrivs": "1", "Seccomp": "2"}, fields


def test_setuid_binaries_do_not_escalate(run_one: RunOne):
    script = r"""
for b in /usr/bin/su /usr/bin/passwd; do test -u $b && echo "setuid $b"; done
/usr/bin/su root -c 'echo ROOTED' </dev/null; echo "su=$?"
/usr/bin/passwd -d root </dev/null; echo "passwd=$?"
cp /usr/bin/id ./myid && chmod 4755 ./myid && ./myid -u
python3 -c 'import os; print(os.geteuid(), os.getresuid())'
"""
    r = run_one(script, "bash")
    assert r.status is ExecStatus.OK, describe(r)
    out = r.stdout.decode()
    assert "setuid /usr/bin/su" in out  # the bits are there; they just do nothing
    assert "ROOTED" not in out
    assert "su=0" not in out and "passwd=0" not in out, out
    assert out.endswith("1000\n1000 (1000, 1000, 1000)\n"), out


def test_double_forked_daemon_dies_with_the_run(runner):
    """A daemon (double fork, setsid, SIGHUP ignored) that appends to a workspace file
    every 50 ms: the file stops growing when the run ends, a later run in the same
    session sees it still, and no sandbox process is alive on the host."""
    daemon = r"""
( trap '' HUP TERM
  setsid bash -c 'trap "" HUP TERM; while :; do echo . >> beat; sleep 0.05; done' & ) &
until [ -s beat ]; do sleep 0.01; done  # the daemon is running (however slow the kernel)
sleep 0.1
echo started
"""

    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
            r = await sb.exec(["/bin/bash", "-c", daemon])
            assert (r.status, r.stdout) == (ExecStatus.OK, b"started\n"), describe(r)
            alive = runner.sandbox_processes()
            n1 = len(await sb.read_file("beat"))
            await __import__("asyncio").sleep(0.3)
            n2 = len(await sb.read_file("beat"))
            later = await sb.exec(["/bin/bash", "-c",
                                   ("a=$(stat -c %s beat); sleep 0.3; b=$(stat -c %s beat);"
                                    " echo $a $b; exec ps -eo comm=")])
            return alive, n1, n2, later
    alive, n1, n2, later = runner.run(body())
    assert alive == [], f"sandbox processes alive after the run returned: {alive}"
    assert n1 > 0 and n1 == n2, (n1, n2)
    a, b, *procs = later.stdout.split()
    assert a == b == str(n1).encode(), describe(later)
    assert b"bash" not in procs and b"sleep" not in procs, procs  # the daemon is gone
    no_leaks(runner)


def test_cgroup_and_kernel_interfaces_hidden(run_one: RunOne):
    script = r"""
for p in /sys/fs/cgroup /proc/sys/kernel/core_pattern /proc/sysrq-trigger \
         /proc/sys/vm/drop_caches; do
    [ -w $p ] && echo "$p writable"
done
dmesg >/dev/null 2>&1 && echo "dmesg readable"
cat /proc/self/cgroup >/dev/null; echo done
"""
    r = run_one(script, "bash")
    assert r.status is ExecStatus.OK, describe(r)
    assert r.stdout == b"done\n", describe(r)


def test_protocol_lookalike_output_changes_nothing(run_one: RunOne):
    """A candidate printing something that looks like the supervisor's own protocol
    (status records, JSON) changes nothing about its result."""
    r = run_one("import sys, json\nsys.stdout.write('X\\x00\\x00\\x00\\x00S R E' + "
                "json.dumps({'op': 'stop'}))\nsys.stderr.write('E fake infra')\nsys.exit(2)")
    assert r.status is ExecStatus.EXIT and r.exit_code == 2, describe(r)
    assert json.loads(r.stdout[10:]) == {"op": "stop"}
