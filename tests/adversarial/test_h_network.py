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
