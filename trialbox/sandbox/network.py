"""Network allow-lists (`Limits.net_allow`), the same on every tier, enforced outside
the candidate.

A sandbox's network namespace N (the namespace tier's cell, or one made here for a
container or a gVisor sandbox) has only `lo` unless its session declares an allow-list.
Then a `Gate` gives N one way out, a veth pair into a *gateway* namespace G that only
the supervisor holds (no process lives in G; it dies with the supervisor's fds):

    candidate ── N: lo, eth0 169.254.0.2/30 (default routes via G) ──veth──┐
                                                                          G: gw 169.254.0.1
      every address is local in G (`local 0.0.0.0/0` and `local ::/0` routes), so
      nothing is ever forwarded out of G; G's nftables input chain accepts TCP to the
      allowed ADDR/PREFIX + port, and counts and refuses everything else (TCP with a
      reset, the rest with ICMP unreachable); a trusted forwarder (this module, in
      the supervisor's event loop) accepts the allowed connections in G and makes
      each again, to the same address and port, from the egress namespace (the
      supervisor's own unless `egress` names another) — only to an allowed pair.

The candidate can change none of it: N and G belong to the host's user namespace and
the candidate holds no capability there (it runs as uid 1000 in a user namespace of
its own, with no capabilities, under seccomp, or inside gVisor), and G is not even
reachable from N but through the veth. The refused count is G's nftables counter,
read by the supervisor (`Gate.refused()`): a TCP connection attempt counts once (its
SYN), any other packet (UDP, ICMP) once each; neighbour discovery and multicast group
reports, which the kernels send on their own, are not counted.

Only sessions that declare an allow-list pay for this (a namespace and a veth made and
torn down, two `ip` and one `nft` run: ~20-40 ms per session here); every other session
starts exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import json
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from trialbox.errors import SandboxStartError, SandboxUnavailable
from trialbox.types import parse_endpoint

log = logging.getLogger("trialbox.sandbox.network")

CLONE_NEWNET = 0x40000000
NFT = "/usr/sbin/nft"
IP = "/usr/sbin/ip"
NSENTER = "/usr/bin/nsenter"
GW4, SB4 = "169.254.0.1", "169.254.0.2"
GW6, SB6 = "fe80::1", "fe80::2"
CONNECT_TIMEOUT_S = 10.0
"""How long the forwarder waits for an allowed destination to accept."""
MAX_CONNECTIONS = 64
"""Connections one gate forwards (or waits on) at once, two supervisor descriptors
each; past it a new one is reset at once (`Gate.busy`). Without it one candidate opening
and closing connections to an allowed destination that does not answer held ~20,000 of
the supervisor's descriptors within 15 s (each waiting CONNECT_TIMEOUT_S), until its
accept failed with EMFILE for every session."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]

T = TypeVar("T")

Rule = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int]


def rules_of(allow: Sequence[str]) -> list[Rule]:
    """`Limits.net_allow` entries as (network, port) pairs (already validated by Limits)."""
    return [(ipaddress.ip_network(net), port) for net, port in map(parse_endpoint, allow)]


def check_node() -> None:
    """Raise SandboxUnavailable naming what this node lacks for allow-lists."""
    for path, package in ((NFT, "nftables"), (IP, "iproute2"), (NSENTER, "util-linux")):
        if not os.access(path, os.X_OK):
            raise SandboxUnavailable(
                f"network allow-lists need {path}; install it: apt-get install {package}")


def _in_thread(fn: Callable[[], T]) -> T:
    """Run `fn` in a thread of its own that exits afterwards: namespace changes
    (unshare, setns) apply to the calling thread only, and no other code ever runs in
    a thread left in another namespace."""
    out: list[T] = []
    err: list[BaseException] = []

    def body() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # handed to the caller
            err.append(e)

    t = threading.Thread(target=body, name="trialbox-netns", daemon=True)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def new_netns() -> int:
    """A fresh network namespace with no process in it, held by the fd returned (it
    dies when that fd and every socket in it are closed)."""
    def make() -> int:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    return _in_thread(make)


def socket_in(netns_fd: int | None, family: int, kind: int = socket.SOCK_STREAM
              ) -> socket.socket:
    """A socket created in the network namespace `netns_fd` (None: ours)."""
    if netns_fd is None:
        return socket.socket(family, kind)

    def make() -> socket.socket:
        _check(_libc.setns(netns_fd, CLONE_NEWNET), "setns")
        return socket.socket(family, kind)
    return _in_thread(make)


def same_netns(fd: int) -> bool:
    """True when `fd` is the supervisor's own network namespace."""
    a, b = os.fstat(fd), os.stat("/proc/self/ns/net")
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _run(argv: list[str], fds: Sequence[int], stdin: str = "") -> str:
    p = subprocess.run(argv, input=stdin.encode(), capture_output=True, pass_fds=tuple(fds),
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"},
                       timeout=20)
    if p.returncode != 0:
        raise SandboxStartError(f"network gate: {' '.join(argv[-2:])} failed: "
                                f"{p.stderr.decode(errors='replace').strip()[:400]}")
    return p.stdout.decode()


def _enter(fd: int) -> list[str]:
    return [NSENTER, f"--net=/proc/self/fd/{fd}"]


def ruleset(rules: Sequence[Rule]) -> str:
    """G's nftables ruleset: the allowed pairs accepted, everything else from the
    sandbox counted and refused.

    >>> print(ruleset(rules_of(["10.9.0.0/24:80"])).splitlines()[5].strip())
    ip daddr 10.9.0.0/24 tcp dport 80 accept
    """
    allow = "\n".join(
        f"    {'ip' if net.version == 4 else 'ip6'} daddr {net} tcp dport {port} accept"
        for net, port in rules)
    return f"""table inet trialbox {{
  counter refused {{ }}
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname != "gw" accept
{allow}
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit,
                   mld-listener-report, mld2-listener-report }} accept
    ip daddr 224.0.0.0/4 drop
    ip6 daddr ff00::/8 drop
    tcp flags & (syn | ack) == syn counter name "refused" reject with tcp reset
    meta l4proto tcp reject with tcp reset
    counter name "refused" reject
  }}
}}
"""


def configure_sandbox_side(netns_fd: int) -> None:
    """Bring up `lo` in a namespace made by `new_netns` (a container's or gVisor's):
    the namespace tier's cells have it already."""
    _run([*_enter(netns_fd), IP, "link", "set", "lo", "up"], [netns_fd])


class Gate:
    """One sandbox network namespace's allow-listed way out (see the module doc).

    `open` (blocking: run it in a thread) builds G, the veth, the routes, the rules and
    the listeners; `serve()` then accepts and forwards on the event loop; `close()`
    stops everything and returns the final refused count."""

    def __init__(self, rules: Sequence[Rule], egress: str = ""):
        self.rules = list(rules)
        self.egress = egress
        self.g: int = -1
        self.listeners: list[socket.socket] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.socks: set[socket.socket] = set()
        self.forwarded = 0
        """Connections made to an allowed destination."""
        self.failed = 0
        """Allowed connections whose destination did not accept."""
        self.busy = 0
        """Connections reset because MAX_CONNECTIONS were in flight already."""
        self.active = 0
        self.closed = False
        self._final: int | None = None
        self._egress_fd: int | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def open(cls, allow: Sequence[str], sandbox_netns: int, egress: str = "") -> Gate:
        """Attach a gate to the namespace `sandbox_netns` (an fd; never the
        supervisor's own: that would put the veth and its routes on the host)."""
        check_node()
        if same_netns(sandbox_netns):
            raise SandboxStartError("network gate: the sandbox's network namespace is the "
                                    "supervisor's own; refusing to configure it")
        gate = cls(rules_of(allow), egress)
        try:
            gate._build(sandbox_netns)
        except BaseException:
            gate.close()
            raise
        return gate

    def _build(self, n: int) -> None:
        if self.egress:
            try:
                self._egress_fd = os.open(self.egress, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise SandboxStartError(f"network gate: the egress namespace "
                                        f"{self.egress!r} cannot be opened: {e}") from e
        self.g = g = new_netns()
        _run([*_enter(g), IP, "-batch", "-"], [g, n], "\n".join([
            "link set lo up",
            f"link add gw type veth peer name eth0 netns /proc/self/fd/{n}",
            "link set gw addrgenmode none",  # only the link-local address given below
            f"addr add {GW4}/30 dev gw",
            f"addr add {GW6}/64 dev gw nodad",
            "link set gw up",
            # every address is G's own (so a connection to anywhere ends in G's
            # input chain: accepted for the forwarder, or refused and counted) except
            # the sandbox's end of the veth, routed back out explicitly (IPv6 consults
            # the local table before the main one)
            "route add local 0.0.0.0/0 dev lo table local",
            "route add local ::/0 dev lo table local",
            f"route add {SB4}/32 dev gw table local",
            "route add fe80::/64 dev gw table local",
        ]) + "\n")
        _run([*_enter(g), NFT, "-f", "-"], [g], ruleset(self.rules))
        _run([*_enter(n), IP, "-batch", "-"], [n], "\n".join([
            "link set lo up",
            # no address of the kernel's making beside ours: an automatic link-local one
            # (EUI-64, usable once its DAD is over) would become the source of the
            # sandbox's IPv6 connections
            "link set eth0 addrgenmode none",
            f"addr add {SB4}/30 dev eth0",
            f"addr add {SB6}/64 dev eth0 nodad",
            "link set eth0 up",
            f"route add default via {GW4} dev eth0",
            f"route add default via {GW6} dev eth0",
        ]) + "\n")
        for family, port in sorted({(socket.AF_INET if net.version == 4 else
                                     socket.AF_INET6, port) for net, port in self.rules}):
            s = socket_in(g, family)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(("0.0.0.0" if family == socket.AF_INET else "::", port))
            s.listen(128)
            s.setblocking(False)
            self.listeners.append(s)

    def allowed(self, addr: str, port: int) -> bool:
        ip = ipaddress.ip_address(addr.split("%")[0])
        return any(p == port and ip in net for net, p in self.rules)

    def serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start accepting on the event loop (one task per listener)."""
        self.loop = loop
        for s in self.listeners:
            self._spawn(loop, self._accept(loop, s))

    def _spawn(self, loop: asyncio.AbstractEventLoop,
               coro: Coroutine[Any, Any, None]) -> None:
        task = loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _accept(self, loop: asyncio.AbstractEventLoop, lsock: socket.socket) -> None:
        try:
            while not self.closed:
                try:
                    conn, _peer = await loop.sock_accept(lsock)
                except OSError as e:  # EMFILE, ENOBUFS: the supervisor's, for a moment
                    log.warning("network gate: accept failed: %s", e)
                    await asyncio.sleep(0.05)
                    continue
                if self.active >= MAX_CONNECTIONS:
                    self.busy += 1
                    with contextlib.suppress(OSError):  # the candidate sees a reset
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    conn.close()
                    continue
                conn.setblocking(False)
                self.active += 1
                self._spawn(loop, self._forward(loop, conn))
        finally:  # closed here, after the loop has stopped watching it
            lsock.close()

    async def _forward(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        self.socks.add(conn)
        out: socket.socket | None = None
        try:
            dst = conn.getsockname()
            if not self.allowed(dst[0], dst[1]):  # G's rules let it through: never here
                log.error("network gate: %s:%s reached the forwarder but is not allowed",
                          dst[0], dst[1])
                return
            out = await loop.run_in_executor(None, socket_in, self._egress_fd,
                                             conn.family)
            out.setblocking(False)
            self.socks.add(out)
            try:
                await asyncio.wait_for(loop.sock_connect(out, dst[:2] if conn.family ==
                                                         socket.AF_INET else dst),
                                       CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as e:
                self.failed += 1
                log.info("network gate: allowed %s:%s did not accept: %s", dst[0], dst[1],
                         e)
                with contextlib.suppress(OSError):  # the candidate sees a reset
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return
            self.forwarded += 1
            await asyncio.gather(self._pump(loop, conn, out), self._pump(loop, out, conn))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.active -= 1
            for s in (conn, out):
                if s is not None:
                    self.socks.discard(s)
                    s.close()

    @staticmethod
    async def _pump(loop: asyncio.AbstractEventLoop, src: socket.socket,
                    dst: socket.socket) -> None:
        try:
            while True:
                data = await loop.sock_recv(src, 65536)
                if not data:
                    break
                await loop.sock_sendall(dst, data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def refused(self) -> int:
        """Packets G refused so far (TCP attempts once each). Blocking (~5-10 ms: one
        `nft` run); the final figure once closed."""
        if self._final is not None:
            return self._final
        if self.g < 0:
            return 0
        out = _run([*_enter(self.g), NFT, "-j", "list", "counter", "inet", "trialbox",
                    "refused"], [self.g])
        for item in json.loads(out).get("nftables", []):
            if "counter" in item:
                return int(item["counter"]["packets"])
        raise SandboxStartError("network gate: no refused counter in G's ruleset")

    def close(self) -> int:
        """Stop forwarding, read the final count, let G (and the veth) go. Idempotent;
        blocking; callable from any thread."""
        if self.closed:
            return self._final or 0
        try:
            self._final = self.refused()
        except (SandboxStartError, OSError, ValueError, subprocess.SubprocessError) as e:
            log.warning("network gate: could not read the refused count: %s", e)
            self._final = 0
        self.closed = True
        if self.tasks and self.loop is not None:
            # each task closes its sockets as it ends (once the loop unwatches them)
            tasks = list(self.tasks)

            def cancel() -> None:
                for task in tasks:
                    task.cancel()
            try:
                on_loop = asyncio.get_running_loop() is self.loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                cancel()
            elif not self.loop.is_closed():
                self.loop.call_soon_threadsafe(cancel)
        else:  # never served
            for s in self.listeners:
                s.close()
        self.listeners = []
        for fd in (self.g, self._egress_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.g, self._egress_fd = -1, None
        return self._final
