"""A node offers the OCI tiers too (`gvisor`, `container`), and proves each tier it
declares before it takes work: a real Ray cluster on this machine whose head offers
`trialbox_tier_gvisor`, HumanEval graded there through `RayBackend` + `ClusterEvaluator`
in gVisor, and a second raylet — a host without runsc (its own mount namespace, runsc
masked) — declaring gvisor: refused with doctor's reason, nothing of it left."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.conftest import eventually  # noqa: E402
from tests.cluster.test_ray_cluster import (  # noqa: E402
    head_cluster,
    driving,
    node_resources,
)
from trialbox.cluster.backend import ClusterConfig, NodeStartFailed, RayBackend  # noqa: E402
from trialbox.cluster.node import Node, NodeConfig, leaks_of  # noqa: E402
from trialbox.errors import SandboxUnavailable  # noqa: E402
from trialbox.sandbox.oci import OciConfig, cgroup_roots  # noqa: E402
from trialbox.sandbox.reaper import owner_alive  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
NO_LEAKS: dict[str, list[str]] = {"cgroups": [], "state": [], "processes": []}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = head_cluster("gvisor")
    with driving(c, tmp_path_factory):
        yield c


def config(cluster: Cluster, **kw: Any) -> ClusterConfig:
    return ClusterConfig(address=cluster.address, poll_s=0.2, heartbeat_s=0.2,
                         dead_after_s=30.0, warm=1, **kw)


def runsc_processes(ids: list[str]) -> list[str]:
    """Command lines of runsc processes (sandbox, gofer, Sentry) of these providers."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [a for a in ps.splitlines() if "runsc" in a and any(i in a for i in ids)]


# ---------------------------------------------------------------------- grading
def test_humaneval_graded_in_gvisor_on_a_node(cluster: Cluster, tmp_path: Path) -> None:
    """Canonical solutions pass, an exploit does not, a candidate sees gVisor's kernel
    (not the host's); after close no runsc container, cgroup, state or process of the
    node's providers is left on the host."""
    from trialbox.bench.humaneval_mix import exploit_completion
    from trialbox.cluster.evaljob import ClusterEvaluator
    from trialbox.schedule.evaljob import evaluate_journaled, inputs_fingerprint, open_run
    from trialbox.store.tasks import index, load_humaneval
    tasks = load_humaneval()[:3]
    host = os.uname().release
    # passes only where its kernel is not the host's: under gVisor's Sentry
    probe = (f"    import os\n    if os.uname().release == {host!r}:\n        return None\n"
             + tasks[1].canonical_solution)
    samples = [{"task_id": t.task_id, "completion": t.canonical_solution} for t in tasks]
    samples += [{"task_id": tasks[0].task_id,
                 "completion": exploit_completion("sys-exit", tasks[0])},
                {"task_id": tasks[1].task_id, "completion": probe}]

    async def body() -> tuple[list[Any], list[str]]:
        async with RayBackend(config(cluster)) as be:
            (info,) = [m.info for m in be.members.values()]
            assert info["tiers"] == ["gvisor"] and info["engines"] == {"gvisor": "runsc"}
            pools = info["pools"]
            # the live provider is what leaks_of sees (so its "nothing left" means it)
            # (its warm sandboxes start in the background: on a loaded host the first may
            # not be up yet when the node has joined)
            def up() -> bool:
                live = leaks_of(pools)
                return bool(live["cgroups"] and live["state"] and live["processes"]
                            and runsc_processes(pools))
            assert await eventually(up, 30), leaks_of(pools)
            ev = ClusterEvaluator(index(tasks), be, "eval:gv", tier="gvisor", workers=2)
            fp = inputs_fingerprint(b"", list(index(tasks)), repeat=1, reward="binary",
                                    time_scale=None, amplified=None)
            journal = open_run(str(tmp_path / "j.db"), "gv", fp, False)
            try:
                rows, _, _ = await evaluate_journaled(journal, "gv", ev, samples,
                                                      repeat=1, fingerprint=fp)
            finally:
                journal.close()
            assert be.placer.stats.placed == len(samples)
        (report,) = be.close_reports.values()
        assert report["leaks"] == NO_LEAKS and report["runs"] == len(samples), report
        return rows, pools

    rows, pools = asyncio.run(body())
    verdicts = [(r.task_id, r.outcome.value, r.passed) for r in rows]
    assert [p for _, _, p in verdicts] == [True, True, True, False, True], verdicts
    assert rows[3].reward == 0.0
    assert leaks_of(pools) == NO_LEAKS and not runsc_processes(pools)


# ---------------------------------------------------------------------- refusal
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mnt_ns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


@contextlib.contextmanager
def host_without_runsc(head: str, resources: dict[str, float],
                       tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A raylet joining `head` in its own mount namespace where /usr/bin/runsc is an
    empty, non-executable file: a machine on which gVisor is not installed. Every process
    of that namespace is killed on exit."""
    blank = tmp / "runsc"
    blank.write_bytes(b"")
    blank.chmod(0o644)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    start = [ray_bin, "start", "--block", "--address", head, "--num-cpus", "1",
             "--resources", json.dumps(resources), "--disable-usage-stats",
             "--object-store-memory", str(100 << 20),
             "--dashboard-agent-listen-port", str(_free_port())]
    # unshare -m: a private mount namespace (util-linux makes its mounts private)
    script = f'mount --bind "{blank}" /usr/bin/runsc && exec "$@"'
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script, "sh", *start],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while (ns := _mnt_ns(proc.pid)) == _mnt_ns("self") or not ns:
            assert proc.poll() is None and time.monotonic() < deadline, "unshare failed"
            time.sleep(0.01)
        yield proc
    finally:
        deadline = time.monotonic() + 30
        while pids := [p for p in os.listdir("/proc") if p.isdigit() and _mnt_ns(p) == ns]:
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(p), signal.SIGKILL)
            assert time.monotonic() < deadline, f"processes left in the namespace: {pids}"
            time.sleep(0.05)
        proc.wait(timeout=10)


def _oci_owners() -> set[str]:
    """OCI providers' state directories and cgroups on this host, by owner id."""
    found = set(os.listdir(OciConfig().state_dir)) if os.path.isdir(
        OciConfig().state_dir) else set()
    for root in cgroup_roots():
        top = os.path.join(root, "trialbox-oci")
        if os.path.isdir(top):
            found |= set(os.listdir(top))
    return found


def test_a_tier_the_node_cannot_run_fails_its_start_and_closes_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`Node.start` without Ray, in this process (a node actor that is killed cleans up
    at its exit anyway; here the process lives on, so a provider left open would show):
    container opens, gvisor's probe fails, the container provider is closed again."""
    import trialbox.cluster.node as node_mod
    import trialbox.sandbox.gvisor as gvisor
    monkeypatch.setattr(gvisor, "RUNSC", "/nonexistent/runsc")  # doctor's check reads it
    monkeypatch.setenv("PATH", "/nonexistent")
    opened: list[Any] = []
    real = node_mod.open_tier

    async def spy(tier: str, config: NodeConfig) -> Any:
        opened.append(await real(tier, config))
        return opened[-1]
    monkeypatch.setattr(node_mod, "open_tier", spy)
    node = Node(NodeConfig("n1", 1, ("container", "gvisor"), warm=1))
    with pytest.raises(SandboxUnavailable, match=r"this node declares trialbox_tier_gvisor"
                       r" but cannot run the gvisor tier: runsc \(gVisor\) is not "
                       r"installed \(fix: apt-get install runsc\)"):
        asyncio.run(node.start())
    (container,) = opened
    assert container.tier == "container" and container.started and container.closed
    assert not node._pools and leaks_of([container.id]) == NO_LEAKS


def test_node_declaring_a_tier_it_cannot_run_is_refused(cluster: Cluster,
                                                        tmp_path: Path) -> None:
    """The node declares container and gvisor; container starts (runc is there), the
    gvisor probe fails: the backend refuses to start with doctor's reason and fix, and
    the container provider it had opened is closed (no state, cgroup or process)."""
    before = _oci_owners()
    resources = node_resources(1, "container", "gvisor")
    resources["masked_host"] = 1
    with host_without_runsc(cluster.address, resources, tmp_path) as node:
        deadline = time.monotonic() + 120
        while not any(n["Alive"] and n["Resources"].get("masked_host")
                      for n in ray.nodes()):
            assert node.poll() is None and time.monotonic() < deadline, "no raylet"
            time.sleep(0.2)
        with pytest.raises(NodeStartFailed) as e:
            asyncio.run(RayBackend(config(cluster, min_nodes=2)).start())
        msg = str(e.value)
        for part in ("declares trialbox_tier_gvisor but cannot run the gvisor tier",
                     "runsc (gVisor) is not installed", "fix: apt-get install runsc",
                     "trialbox doctor"):
            assert part in msg, msg
        assert "ray::" not in msg and "Traceback" not in msg, msg  # its words, not Ray's
    # what the refused node had started (its container provider) is gone; entries of
    # live owners are other processes' on this shared host
    left = [o for o in _oci_owners() - before if not owner_alive(o)]
    assert not left, left
