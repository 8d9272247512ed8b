"""Worker nodes in network namespaces with their own addresses (`netns.py`): a raylet
per namespace, reached only through its veth on a bridge, the head and the driver on
the bridge's host address. A node is cut off for real (`ip link set <veth> down`):
its processes run on, its packets go nowhere. Every scheduler run journals on the
driver; `check_journal` proves each task has exactly one result."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.cluster.netns import Bridge  # noqa: E402
from tests.cluster.test_ray_cluster import (  # noqa: E402
    HEALTH_CHECK,
    node_resources,
    transitions,
)
from tests.schedule.journal_checks import check_journal  # noqa: E402
from trialbox.cluster.backend import ClusterConfig, RayBackend  # noqa: E402
from trialbox.cluster.node import FakeWorkload  # noqa: E402
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskSpec  # noqa: E402
from trialbox.store.journal import Journal  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
NO_LEAKS = {"cgroups": [], "state": [], "processes": []}


def registered(address: str) -> str | None:
    """The Ray node id of the live raylet at this address, if it has registered."""
    for n in ray.nodes():
        if n["Alive"] and n["NodeManagerAddress"] == address:
            return str(n["NodeID"])
    return None


async def wait_registered(address: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while (nid := await asyncio.to_thread(registered, address)) is None:
        assert time.monotonic() < deadline, f"no raylet at {address} registered"
        await asyncio.sleep(0.2)
    return nid


def test_node_cut_off_by_its_link_work_finishes_elsewhere_once(tmp_path: Path) -> None:
    """n1 (its own namespace and address) runs two namespace-tier sandboxes when its
    link goes down: the driver presumes it dead after `dead_after_s`, the two tasks are
    retried and finish on other nodes, exactly once; n2, started in a new namespace
    mid-run, receives work; n1's link comes back, its answers arrive and are discarded
    (none recorded). Afterwards no namespace, link, process, cgroup or session
    directory of the run is left on the host."""
    with Bridge() as br:
        here = os.getcwd()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "node_ip_address": br.host_ip,
            "_system_config": HEALTH_CHECK, "resources": node_resources(2, "namespace")})
        try:
            os.chdir(tmp_path)  # nodes import trialbox from PYTHONPATH, as the driver
            try:
                ray.init(address=cluster.address, namespace="trialbox",
                         log_to_driver=False, configure_logging=False)
            finally:
                os.chdir(here)
            pools = asyncio.run(_cut_off_run(br, cluster.address,
                                             str(tmp_path / "cut.db")))
        finally:
            ray.shutdown()
            cluster.shutdown()
        # (Bridge.__exit__ kills what is left in the namespaces and deletes them)
    assert not br.leftovers()
    assert not [p for n in br.nodes for p in n.pids()]
    from trialbox.cluster.node import leaks_of
    assert len(pools) == 3 and leaks_of(pools) == NO_LEAKS  # the nodes' pools, on this host


async def _cut_off_run(br: Bridge, head: str, db: str) -> list[str]:
    """The run; returns the ids of the nodes' sandbox pools."""
    n1 = br.node(head, node_resources(2, "namespace"))
    n1_id = await wait_registered(n1.ip)
    cfg = ClusterConfig(address=head, poll_s=0.2, heartbeat_s=0.2, dead_after_s=5.0,
                        min_nodes=2, warm=2)
    async with RayBackend(cfg) as be:
        assert be.members[n1_id].info["node_id"] == n1_id
        pools_of = {nid: m.info["pools"] for nid, m in be.members.items()}
        await be.load("w", FakeWorkload(tier="namespace", seconds=0.5))
        n2_joined = asyncio.Event()
        n2_id: list[str] = []
        held = 8  # tasks that wait for n2 to join, so that work is left for it

        async def job(ctx: Any) -> float | None:
            if int(ctx.task_id[1:]) >= 24 - held:
                await n2_joined.wait()
            await ctx.grading()
            out = await be.run("w", ctx.task_id, tier="namespace")
            await ctx.record_grade(out)
            return 1.0

        async def chaos() -> None:
            while be.placer.load().get(n1_id, 0) < 2:  # both its slots busy
                await asyncio.sleep(0.02)
            n1.cut()
            n2 = br.node(head, node_resources(2, "namespace"))  # joins mid-run
            while n1_id in be.members:  # presumed dead after dead_after_s
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            n1.restore()  # its late answers now reach the driver
            n2_id.append(await wait_registered(n2.ip))
            while n2_id[0] not in be.members:
                await asyncio.sleep(0.05)
            pools_of[n2_id[0]] = be.members[n2_id[0]].info["pools"]
            n2_joined.set()

        journal = Journal(db)
        sc = SchedulerConfig(max_active=16, preempt=False, max_retries=5,
                             backoff_s=0.05, backoff_max_s=0.2)
        try:
            async with Scheduler(journal, "r", job, sc) as s:
                await s.submit([TaskSpec(f"t{i}") for i in range(24)])
                await chaos()
                await s.drain()
            finished = journal.results_of("r")
            grades = journal.grades_of("r")
            answers = {t: grades[(t, finished[t][1])] for t in finished}
        finally:
            journal.close()
        results = check_journal(db, "r", {f"t{i}" for i in range(24)})  # exactly once
        assert all(st == "done" for st, _ in results.values())
        lost = transitions(db, "infra")
        assert len(lost) >= 2 and all("lost" in m for _, m in lost), lost
        for t, _ in lost:  # retried and finished by another node
            assert answers[t]["node"] != n1_id
        assert any(x["node"] == n2_id[0] for x in answers.values())  # the newcomer worked
        for _ in range(300):  # TCP retransmits once the link is up: within seconds
            if be.placer.stats.late_discarded >= 2:
                break
            await asyncio.sleep(0.1)
        assert be.placer.stats.late_discarded >= 2  # the answers came, and were dropped
        ran = await be.lost[n1_id].lease_ids.remote()  # n1 did finish that work
        assert len(ran) >= 2
    # every node closed its pools, the cut-off one too (it answers again)
    assert len(be.close_reports) == 3 and {n1_id, n2_id[0]} <= set(be.close_reports)
    for node, rep in be.close_reports.items():
        assert rep.get("leaks") == NO_LEAKS, (node, rep)
    assert be.close_reports[n1_id]["runs"] >= 2
    return [p for nid in be.close_reports for p in pools_of[nid]]
