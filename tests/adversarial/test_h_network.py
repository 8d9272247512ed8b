"""H: network allow-lists (`Limits.net_allow`, sandbox/network.py) against a hostile
program, on the namespace tier. Traffic goes only to the namespace the test makes
(tests/sandbox/test_network.py's `Mirror`: 10.77.0.5:8080 allowed, 10.77.0.5:9090 and
10.77.0.6:8080 served but not allowed). Every other way out a program can spell —
raw and packet sockets, the gateway's own address on the allowed port, IPv6 link-local,
an IPv4-mapped IPv6 address, UDP/SCTP to the allowed pair, TCP Fast Open to another
port, a network namespace of its own — is refused; the allowed pair still works."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.conftest import Runner
from tests.sandbox.test_network import ROOMY, Mirror
from trialbox.sandbox import PoolConfig, run_code
from trialbox.sandbox import network as nw
from trialbox.types import ExecStatus

ESCAPES = r"""
import json, os, socket
out = {}
def tcp(name, family, addr, **kw):
    s = socket.socket(family)
    s.settimeout(5)
    try:
        s.connect(addr)
        out[name] = s.recv(100).decode() or "connected"
    except OSError as e:
        out[name] = type(e).__name__
    finally:
        s.close()
tcp("allowed", socket.AF_INET, ("10.77.0.5", 8080))
tcp("gateway_allowed_port", socket.AF_INET, ("169.254.0.1", 8080))
tcp("gateway_v6_allowed_port", socket.AF_INET6, ("fe80::1", 8080, 0, socket.if_nametoindex("eth0")))
tcp("mapped_other_addr", socket.AF_INET6, ("::ffff:10.77.0.6", 8080))
tcp("mapped_other_port", socket.AF_INET6, ("::ffff:10.77.0.5", 9090))
tcp("loopback_allowed_port", socket.AF_INET, ("127.0.0.1", 8080))
for name, args in (("raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)),
                   ("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0)),
                   ("sctp", (socket.AF_INET, socket.SOCK_STREAM, 132))):
    try:
        s = socket.socket(*args)
        s.settimeout(5)
        if name == "sctp":
            s.connect(("10.77.0.5", 8080)); out[name] = s.recv(100).decode() or "connected"
        else:
            out[name] = "created"
    except OSError as e:
        out[name] = type(e).__name__
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(3)
try:
    u.sendto(b"x", ("10.77.0.5", 8080)); out["udp_reply"] = u.recv(100).decode()
except OSError as e:
    out["udp_reply"] = type(e).__name__
f = socket.socket(); f.settimeout(5)
try:
    f.sendto(b"GET", 0x20000000, ("10.77.0.5", 9090))   # MSG_FASTOPEN
    out["fastopen_other_port"] = f.recv(100).decode() or "connected"
except OSError as e:
    out["fastopen_other_port"] = type(e).__name__
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.unshare(0x10000000 | 0x40000000)        # CLONE_NEWUSER | CLONE_NEWNET
out["unshare"] = "done" if rc == 0 else os.strerror(ctypes.get_errno())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def gated() -> Iterator[Runner]:
    nw.check_node()
    m = Mirror()
    r = Runner(PoolConfig(warm=1, net_egress=m.path))
    _MIRRORS[id(r)] = m
    yield r
    r.close()
    m.close()


def test_no_other_way_out_than_the_allowed_pair(gated: Runner) -> None:
    async def body():
        async with await gated.pool.open(ROOMY.with_(net_allow=("10.77.0.5:8080",))) as sb:
            return await run_code(sb, ESCAPES, "python"), await sb.network_refused()
    r, refused = gated.run(body(), timeout=180)
    assert r.status is ExecStatus.OK, (r.status, r.message, r.stderr[-800:])
    out = json.loads(r.stdout)
    assert out.pop("allowed") == "allowed", out
    leaked = {k: v for k, v in out.items()
              if v in ("allowed", "other port", "other address", "connected", "created",
                       "done") or (k == "udp_reply" and v not in ("TimeoutError",
                                                                 "ConnectionRefusedError"))}
    assert not leaked, out
    assert refused >= 4, (refused, out)
    gated.assert_no_leaks(timeout=30)


FLOOD = r"""
import socket, time
n, t, socks = 0, time.time(), []
while time.time() - t < 8:
    s = socket.socket(); s.setblocking(False)
    s.connect_ex(("10.77.0.5", 7070))    # allowed; its server never accepts
    socks.append(s)
    if len(socks) > 150:
        socks.pop(0).close()
    n += 1
print(n)
"""

NEIGHBOUR = r"""
import socket, time
for i in range(5):
    s = socket.create_connection(("10.77.0.5", 8080), 8)
    assert s.recv(100) == b"allowed"
    s.close(); time.sleep(0.3)
print("ok")
"""


def test_one_session_cannot_exhaust_the_forwarder_for_everyone(gated: Runner) -> None:
    """A candidate opening and dropping connections to an allowed destination that
    never answers: the supervisor's descriptors stay bounded (before: ~20,000 within
    15 s, its limit, and the gate's accept died with EMFILE) and a neighbour's allowed
    connections work throughout."""
    import asyncio
    import os
    import socket

    hole = nw.socket_in(_mirror_ns(gated), socket.AF_INET)
    hole.bind(("10.77.0.5", 7070))
    hole.listen(0)

    async def body():
        base = len(os.listdir("/proc/self/fd"))
        peak, stop = [base], asyncio.Event()

        async def watch():
            while not stop.is_set():
                peak.append(len(os.listdir("/proc/self/fd")))
                await asyncio.sleep(0.2)

        async def flood():
            lim = ROOMY.with_(net_allow=("10.77.0.5:7070",))
            async with await gated.pool.open(lim) as sb:
                return await run_code(sb, FLOOD, "python")

        async def neighbour():
            await asyncio.sleep(3)
            lim = ROOMY.with_(net_allow=("10.77.0.5:8080",))
            async with await gated.pool.open(lim) as sb:
                return await run_code(sb, NEIGHBOUR, "python")

        w = asyncio.ensure_future(watch())
        try:
            f, n = await asyncio.gather(flood(), neighbour())
        finally:
            stop.set()
            await w
        return base, max(peak), f, n
    try:
        base, peak, f, n = gated.run(body(), timeout=180)
    finally:
        hole.close()
    assert f.status is ExecStatus.OK and int(f.stdout) > 0, (f.status, f.stderr[-300:])
    assert n.status is ExecStatus.OK and n.stdout == b"ok\n", (n.status, n.stderr[-500:])
    assert peak - base < 600, (base, peak)   # 2 x MAX_CONNECTIONS (64) and the sessions
    gated.assert_no_leaks(timeout=30)


def _mirror_ns(gated: Runner) -> int:
    return _MIRRORS[id(gated)].ns


_MIRRORS: dict[int, Mirror] = {}
