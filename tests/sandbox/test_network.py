"""Network allow-lists (`Limits.net_allow`, sandbox/network.py) on every tier, for real.

The servers live in a network namespace this module makes (`Mirror`: addresses
10.77.0.5 and 10.77.0.6 on its loopback), which the providers use as their egress
namespace; no traffic goes anywhere else. On each tier: the allow-listed address and
port are reachable, another port of the same address, another address, another network
and IPv6 are refused, each refusal counted outside the candidate; the candidate cannot
change the rules; a session without an allow-list has no route out at all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Runner
from tests.sandbox.conftest import FAST, describe
from tests.sandbox.oci_cases import OciHarness
from trialbox.errors import LimitsError, UsageError
from trialbox.sandbox import PoolConfig, run_code
from trialbox.sandbox import network as nw
from trialbox.sandbox.audit import AuditConfig, AuditLog, audited, query
from trialbox.sandbox.container import ContainerProvider
from trialbox.sandbox.gvisor import GVisorProvider
from trialbox.sandbox.oci import OciConfig
from trialbox.types import ExecStatus, Limits

ALLOWED = "10.77.0.5:8080"
ROOMY = FAST.with_(wall_s=30, cpu_s=30)
"""Time is not what these tests check: a probe under gVisor on a loaded host (load 40+
here) can take seconds."""

PROBE = r"""
import json, socket
out = {}
for name, family, addr in [
        ("allowed", socket.AF_INET, ("10.77.0.5", 8080)),
        ("other_port", socket.AF_INET, ("10.77.0.5", 9090)),
        ("other_addr", socket.AF_INET, ("10.77.0.6", 8080)),
        ("other_net", socket.AF_INET, ("10.78.0.1", 8080)),
        ("gateway", socket.AF_INET, ("169.254.0.1", 22)),
        ("ipv6", socket.AF_INET6, ("fd00::1", 8080))]:
    s = socket.socket(family)
    s.settimeout(5)
    try:
        s.connect(addr)
        out[name] = s.recv(100).decode()
    except OSError as e:
        out[name] = type(e).__name__
    finally:
        s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("10.77.0.5", 8080))
except OSError as e:
    out["udp"] = type(e).__name__
print(json.dumps(out))
"""
"""Six connection attempts (one allowed) and one UDP datagram."""

TAMPER = r"""
import subprocess, socket
for argv in (["/usr/sbin/ip", "route", "add", "10.77.0.6/32", "dev", "lo"],
             ["/usr/sbin/ip", "link", "set", "eth0", "down"]):
    try:
        r = subprocess.run(argv, capture_output=True)
        print(argv[2], r.returncode)
    except OSError as e:
        print(argv[2], type(e).__name__)
s = socket.socket(); s.settimeout(5)
s.connect(("10.77.0.5", 8080)); print(s.recv(100).decode())
"""


class Mirror:
    """A network namespace of the test's with servers on 10.77.0.5:8080 ("allowed"),
    10.77.0.5:9090 and 10.77.0.6:8080 (both reachable there, but not allow-listed)."""

    def __init__(self) -> None:
        self.ns = nw.new_netns()
        self.path = f"/proc/{os.getpid()}/fd/{self.ns}"
        subprocess.run([nw.NSENTER, f"--net={self.path}", nw.IP, "-batch", "-"],
                       input=b"link set lo up\naddr add 10.77.0.5/32 dev lo\n"
                             b"addr add 10.77.0.6/32 dev lo\n"
                             b"addr add fd00:77::5/128 dev lo nodad\n", check=True)
        self.socks = [self._serve("10.77.0.5", 8080, b"allowed"),
                      self._serve("10.77.0.5", 9090, b"other port"),
                      self._serve("10.77.0.6", 8080, b"other address"),
                      self._serve("fd00:77::5", 8080, b"allowed v6", socket.AF_INET6),
                      self._serve("fd00:77::5", 9090, b"other v6 port", socket.AF_INET6)]

    def _serve(self, addr: str, port: int, reply: bytes,
               family: int = socket.AF_INET) -> socket.socket:
        ls = nw.socket_in(self.ns, family)
        ls.bind((addr, port))
        ls.listen(16)

        def loop() -> None:
            while True:
                try:
                    c, _ = ls.accept()
                except OSError:
                    return
                with c:
                    c.sendall(reply)

        threading.Thread(target=loop, daemon=True).start()
        return ls

    def close(self) -> None:
        for s in self.socks:
            s.shutdown(socket.SHUT_RDWR)
            s.close()
        os.close(self.ns)


@pytest.fixture(scope="module")
def mirror() -> Iterator[Mirror]:
    try:
        nw.check_node()
    except Exception as e:
        pytest.fail(f"{e} (scripts/setup-system.sh installs it)")
    m = Mirror()
    yield m
    m.close()


class Tier:
    """One tier's provider in its own event loop, egress through the mirror."""

    def __init__(self, name: str, mirror: Mirror) -> None:
        self.name = name
        self.h: Any
        if name == "namespace":
            self.h = Runner(PoolConfig(warm=1, net_egress=mirror.path))
            self.provider: Any = self.h.pool
        else:
            config = OciConfig(warm=0, net_egress=mirror.path)
            self.provider = (GVisorProvider(config) if name == "gvisor"
                             else ContainerProvider(config))
            self.h = OciHarness(self.provider)

    def run(self, coro: Any) -> Any:
        return self.h.run(coro)

    def probe(self, allow: tuple[str, ...], code: str = PROBE
              ) -> tuple[dict[str, str], int, Any]:
        async def body() -> tuple[Any, int]:
            async with await self.provider.open(ROOMY.with_(net_allow=allow)) as sb:
                r = await run_code(sb, code, "python")
                refused = await sb.network_refused()
            return r, refused
        r, refused = self.run(body())
        assert r.status is ExecStatus.OK, describe(r)
        return (json.loads(r.stdout) if code is PROBE else {}), refused, r

    def close(self) -> None:
        self.h.close()


@pytest.fixture(scope="module", params=["namespace", "container", "gvisor"])
def tier(request: pytest.FixtureRequest, mirror: Mirror) -> Iterator[Tier]:
    t = Tier(request.param, mirror)
    yield t
    t.close()


def test_only_the_allowed_endpoint_is_reachable_and_the_rest_is_counted(tier: Tier) -> None:
    out, refused, _ = tier.probe((ALLOWED,))
    assert out["allowed"] == "allowed", out
    for name in ("other_port", "other_addr", "other_net", "gateway", "ipv6"):
        assert out[name] == "ConnectionRefusedError", (name, out)
    # five refused connection attempts (their SYNs) and the UDP datagram, counted
    # outside the sandbox (under gVisor a refused SYN may be sent again: at least 6)
    assert refused >= 6, refused
    if tier.name != "gvisor":
        assert refused == 6, refused


def test_a_network_prefix_allows_every_address_in_it(tier: Tier) -> None:
    out, refused, _ = tier.probe(("10.77.0.0/24:8080",))
    assert out["allowed"] == "allowed" and out["other_addr"] == "other address", out
    assert out["other_port"] == out["other_net"] == "ConnectionRefusedError", out
    assert refused >= 4, refused


V6_PROBE = r"""
import json, socket
out = {}
for port in (8080, 9090):
    s = socket.socket(socket.AF_INET6)
    s.settimeout(5)
    try:
        s.connect(("fd00:77::5", port))
        out[port] = s.recv(100).decode()
    except OSError as e:
        out[port] = type(e).__name__
print(json.dumps(out))
"""


def test_an_ipv6_endpoint_is_allowed_like_any_other(tier: Tier) -> None:
    async def body() -> Any:
        async with await tier.provider.open(ROOMY.with_(net_allow=("[fd00:77::5]:8080",))) \
                as sb:
            r = await run_code(sb, V6_PROBE, "python")
            return r, await sb.network_refused()
    r, refused = tier.run(body())
    assert r.status is ExecStatus.OK, describe(r)
    assert json.loads(r.stdout) == {"8080": "allowed v6", "9090": "ConnectionRefusedError"}
    assert refused >= 1, refused


def test_without_an_allow_list_nothing_is_reachable(tier: Tier) -> None:
    async def body() -> Any:
        async with await tier.provider.open(ROOMY) as sb:
            return await run_code(sb, PROBE, "python")
    r = tier.run(body())
    assert r.status is ExecStatus.OK, describe(r)
    out = json.loads(r.stdout)
    assert "allowed" not in out.values(), out  # no route out at all


def test_the_candidate_cannot_change_the_rules(tier: Tier) -> None:
    _, refused, r = tier.probe((ALLOWED,), TAMPER)
    lines = r.stdout.decode().split()
    # `ip` is refused (no capability over the namespace; or no such device in gVisor)
    assert lines[1] != "0" and lines[3] != "0", r.stdout
    assert lines[-1] == "allowed", r.stdout


def test_the_audit_log_records_refused_attempts(tier: Tier, tmp_path: Any) -> None:
    log = AuditLog(AuditConfig(str(tmp_path / "audit.jsonl"), who="test"))
    provider = audited(tier.provider, log)

    async def body() -> None:
        async with await provider.open(ROOMY.with_(net_allow=(ALLOWED,))) as sb:
            r = await run_code(sb, PROBE, "python")
            assert r.status is ExecStatus.OK, describe(r)
    tier.run(body())
    log.close()
    [rec] = query(str(tmp_path / "audit.jsonl"))
    assert rec.network_refused >= 6, rec
    assert rec.limits["net_allow"] == [ALLOWED]


def test_the_allow_list_is_fixed_for_the_session(tier: Tier) -> None:
    async def body() -> None:
        async with await tier.provider.open(ROOMY.with_(net_allow=(ALLOWED,))) as sb:
            with pytest.raises(UsageError, match="net_allow is fixed"):
                await sb.exec(["/bin/true"], limits=ROOMY)
    tier.run(body())


@pytest.mark.parametrize("bad, hint", [
    ("10.77.0.5", "has no port"),
    ("10.77.0.5:99999", "from 1 to 65535"),
    ("mirror.local:80", "no host names"),
    ("127.0.0.1:8080", "loopback is its own"),
    ("10.77.0.5/24:80", "host bits set"),
    ("fd00::1:80", "brackets"),
])
def test_a_malformed_allow_list_is_a_clear_error(bad: str, hint: str) -> None:
    with pytest.raises(LimitsError, match=hint):
        Limits(net_allow=(bad,))
    with pytest.raises(LimitsError, match="tuple of"):
        Limits(net_allow=bad)  # type: ignore[arg-type]
    with pytest.raises(LimitsError, match="only one of them"):
        Limits(network=True, net_allow=(ALLOWED,))


def test_gate_refuses_the_supervisors_own_namespace() -> None:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        with pytest.raises(Exception, match="supervisor's own"):
            nw.Gate.open((ALLOWED,), fd)
    finally:
        os.close(fd)


def test_the_ruleset_accepts_only_the_allowed_pairs() -> None:
    rules = nw.ruleset(nw.rules_of(["10.1.0.0/24:443", "[fd00::/64]:80"]))
    assert "ip daddr 10.1.0.0/24 tcp dport 443 accept" in rules
    assert "ip6 daddr fd00::/64 tcp dport 80 accept" in rules
    accepts = [line.strip() for line in rules.splitlines()
               if line.strip().endswith("accept") and "policy" not in line]
    assert len(accepts) == 4, accepts  # the two pairs, non-sandbox traffic, NDP/MLD


def test_nothing_of_a_gate_outlives_its_session(tier: Tier) -> None:
    """Every gate's namespace, listeners and forwarded sockets go with the session:
    the supervisor's open fds (a namespace is held by one; sockets are fds) and its
    network namespaces in use do not grow over sessions."""
    def netns_fds() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(("net:", "socket:"))
            except OSError:
                pass
        return n

    async def settle() -> None:
        import asyncio
        await asyncio.sleep(0.3)
    tier.probe((ALLOWED,))
    tier.run(settle())
    before = netns_fds()
    for _ in range(2):
        tier.probe((ALLOWED,))
    tier.run(settle())
    assert netns_fds() <= before, (before, netns_fds())


def test_exec_cli_takes_an_allow_list(capsys: Any, monkeypatch: Any) -> None:
    import io
    import sys

    from trialbox.cli import main
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["exec", "--net-allow", "127.0.0.1:80", "--", "true"]) == 2
    assert "loopback is its own" in capsys.readouterr().err
    code = ("import socket\ns = socket.socket()\ns.settimeout(5)\ntry:\n"
            "    s.connect(('10.77.0.6', 8080))\nexcept OSError as e:\n"
            "    print(type(e).__name__)")
    assert main(["exec", "--json", "--net-allow", ALLOWED, "--", "python3", "-c", code]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stdout"] == "ConnectionRefusedError\n", out
