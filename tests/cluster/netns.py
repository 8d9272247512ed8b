"""Ray worker nodes in network namespaces, closer to real hosts than `cluster_utils`:
each node is a raylet (`ray start --block`) inside its own network namespace with its
own address on a bridge; the head and the driver reach it only through its veth, so
`cut()` (`ip link set <veth> down`) cuts it off the way a failed host or switch port
would, while every process on it keeps running.

    with Bridge() as br:                       # tbbr<pid>, 10.X.Y.1/24
        cluster = Cluster(head_node_args={"node_ip_address": br.host_ip, ...})
        with br.node(cluster.address, resources) as n:   # netns, veth, raylet
            n.cut(); n.restore()

Traffic stays on the bridge (and loopback): the namespaces get no route anywhere
else and the host forwards nothing. Everything is removed on exit, failure included:
every process left in a namespace is killed (`ip netns pids`), then the namespace,
its veth and the bridge are deleted; `leftovers()` says what of ours remains.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import TracebackType

PREFIX = f"tb{os.getpid() % 100000}"
"""Names of everything made here start with this (one test run's own)."""


def ip(*args: str, ns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout


def _free_subnet() -> str:
    """A 10.x.y.0/24 no interface of this host uses (x, y from our pid)."""
    used = ip("-o", "-4", "addr")
    for k in range(256):
        n = (os.getpid() + k) % 250
        net = f"10.213.{n}."
        if net not in used:
            return net
    raise RuntimeError("no free 10.213.x.0/24 subnet for the test bridge")


class NetnsNode:
    """One raylet in its own network namespace (created by `Bridge.node`)."""

    def __init__(self, name: str, veth: str, ip_addr: str, proc: subprocess.Popen[bytes]):
        self.name, self.veth, self.ip, self.proc = name, veth, ip_addr, proc

    def cut(self) -> None:
        """Cut the node off: its link goes down, its processes keep running."""
        ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        ip("link", "set", self.veth, "up")

    def pids(self) -> list[int]:
        out = ip("netns", "pids", self.name, check=False)
        return [int(x) for x in out.split()]

    def stop(self) -> None:
        """Kill every process in the namespace (the raylet, its workers, their
        sandboxes) and wait until none is left."""
        deadline = time.monotonic() + 30
        while True:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes left in netns {self.name}: {pids}")
            time.sleep(0.05)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class Bridge:
    """A bridge on the host with the head's address, and the namespaced nodes on it."""

    def __init__(self) -> None:
        self.name = f"{PREFIX}br"
        self.net = _free_subnet()
        self.host_ip = self.net + "1"
        self.nodes: list[NetnsNode] = []
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), to delete

    def __enter__(self) -> Bridge:
        try:
            ip("link", "add", self.name, "type", "bridge")
            self._made.append(("link", self.name))
            ip("addr", "add", f"{self.host_ip}/24", "dev", self.name)
            ip("link", "set", self.name, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def node(self, head: str, resources: dict[str, float], num_cpus: int = 1,
             env: dict[str, str] | None = None) -> NetnsNode:
        """A new namespace with address .(n+2) on the bridge and a raylet joining
        `head`; returns once `ray start` has launched it (not yet registered)."""
        i = len(self.nodes)
        name, veth = f"{PREFIX}n{i}", f"{PREFIX}v{i}"
        addr = f"{self.net}{i + 2}"
        ip("netns", "add", name)
        self._made.append(("netns", name))
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        self._made.append(("link", veth))
        ip("link", "set", veth, "master", self.name)
        ip("link", "set", veth, "up")
        ip("link", "set", "lo", "up", ns=name)
        ip("addr", "add", f"{addr}/24", "dev", "eth0", ns=name)
        ip("link", "set", "eth0", "up", ns=name)
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        # nsenter enters only the network namespace (`ip netns exec` would also remount
        # /sys in a new mount namespace, hiding the cgroup mounts the sandboxes need)
        cmd = ["nsenter", f"--net=/run/netns/{name}", ray_bin, "start", "--block",
               "--address", head, "--node-ip-address", addr, "--num-cpus",
               str(num_cpus), "--resources", json.dumps(resources),
               "--disable-usage-stats", "--object-store-memory", str(100 << 20)]
        proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        n = NetnsNode(name, veth, addr, proc)
        self.nodes.append(n)
        return n

    def close(self) -> None:
        """Kill what runs in our namespaces, delete them, their veths and the bridge."""
        errors = []
        for n in self.nodes:
            try:
                n.stop()
            except Exception as e:  # keep deleting the rest
                errors.append(str(e))
        for kind, name in reversed(self._made):
            if kind == "netns":
                ip("netns", "del", name, check=False)
            else:
                ip("link", "del", name, check=False)
        self._made.clear()
        if errors:
            raise RuntimeError("; ".join(errors))

    def leftovers(self) -> list[str]:
        """Our namespaces and links still on the host (none after close)."""
        names = ip("netns", "list") + ip("-o", "link")
        return sorted({w.split("@")[0].rstrip(":") for w in names.split()
                       if w.startswith(PREFIX)})
