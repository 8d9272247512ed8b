"""The placer's rules on their own (no Ray): spread, tiers, waiting past capacity by
priority, session affinity, fencing of a lost node's leases, draining."""

from __future__ import annotations

import asyncio

import pytest

from trialbox.cluster.placement import (
    NodeInfo,
    NodeLost,
    NoNodeForTier,
    Placer,
    TierUnavailable,
)
from trialbox.errors import UsageError


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_spread_and_tier() -> None:
    async def body() -> None:
        p = Placer()
        p.add(NodeInfo("a", 2, ("fake",)))
        p.add(NodeInfo("b", 2, ("fake", "namespace")))
        leases = [await p.acquire("fake") for _ in range(4)]
        assert sorted(x.node for x in leases) == ["a", "a", "b", "b"]
        for x in leases:
            assert p.release(x)
        ns = [await p.acquire("namespace") for _ in range(2)]
        assert {x.node for x in ns} == {"b"}
        with pytest.raises(TierUnavailable, match="'gvisor'.*offered: fake, namespace"):
            p.check_tier("gvisor")
    run(body())


def test_waits_past_capacity_by_priority() -> None:
    async def body() -> None:
        p = Placer()
        p.add(NodeInfo("a", 1, ("fake",)))
        first = await p.acquire("fake")
        low = asyncio.ensure_future(p.acquire("fake", priority=2))
        high = asyncio.ensure_future(p.acquire("fake", priority=0))
        await asyncio.sleep(0)
        assert not low.done() and not high.done() and p.waiting() == 2
        p.release(first)
        await asyncio.sleep(0)
        assert high.done() and not low.done()
        p.release(high.result())
        await asyncio.sleep(0)
        assert low.done()
    run(body())


def test_session_affinity_and_lost_node_fencing() -> None:
    async def body() -> None:
        p = Placer()
        p.add(NodeInfo("a", 4, ("fake",)))
        p.add(NodeInfo("b", 4, ("fake",)))
        s1 = await p.acquire("fake", session="ep1")
        p.release(s1)
        for _ in range(5):  # other work moves the load around; the episode stays
            await p.acquire("fake")
        again = await p.acquire("fake", session="ep1")
        assert again.node == s1.node
        again.lost = asyncio.get_running_loop().create_future()
        fenced = p.lose(s1.node, "test")
        assert again in fenced and again.fenced
        with pytest.raises(NodeLost):
            again.lost.result()
        assert p.release(again) is False  # a late answer: discarded
        assert p.stats.late_discarded == 1
        with pytest.raises(NodeLost, match="ep1"):
            await p.acquire("fake", session="ep1")
        other = await p.acquire("fake")
        assert other.node != s1.node  # never placed on the lost node again
    run(body())


def test_drain_takes_no_new_work_and_resolves_when_idle() -> None:
    async def body() -> None:
        p = Placer()
        p.add(NodeInfo("a", 2, ("fake",)))
        p.add(NodeInfo("b", 2, ("fake",)))
        x = await p.acquire("fake")
        idle = p.drain(x.node)
        assert not idle.is_set()
        for _ in range(2):
            assert (await p.acquire("fake")).node != x.node
        p.release(x)
        assert idle.is_set()
    run(body())


def test_work_for_a_tier_whose_nodes_are_all_gone_fails_as_infra_in_time() -> None:
    """The last node of a tier lost (or drained): its waiters, queued before the loss
    or after, wait `orphan_wait_s` for a node of the tier to join, then get
    `NoNodeForTier` (infra) instead of hanging; a node joining in time serves them."""
    async def body() -> None:
        p = Placer(orphan_wait_s=0.2)
        p.add(NodeInfo("a", 1, ("namespace",)))
        p.add(NodeInfo("f", 1, ("fake",)))
        busy = await p.acquire("namespace")
        queued = asyncio.ensure_future(p.acquire("namespace"))  # waiting for a slot
        await asyncio.sleep(0)
        p.lose(busy.node, "test")
        later = asyncio.ensure_future(p.acquire("namespace"))   # after the loss
        other = await p.acquire("fake")   # other tiers are not affected
        await asyncio.sleep(0.05)
        assert not queued.done() and not later.done()
        for fut in (queued, later):
            with pytest.raises(NoNodeForTier, match="'namespace'.*within 0.2 s.*not run"):
                await fut
        assert p.release(other)

        # a node of the tier joining within the wait serves the waiter, and the timer
        # that would have failed it is gone
        p.add(NodeInfo("b", 1, ("namespace",)))
        x = await p.acquire("namespace")
        waiting = asyncio.ensure_future(p.acquire("namespace"))
        await asyncio.sleep(0)
        p.drain("b")
        p.release(x)
        p.remove_drained("b")
        await asyncio.sleep(0.05)
        p.add(NodeInfo("c", 1, ("namespace",)))
        assert (await asyncio.wait_for(waiting, 1)).node == "c"
        assert not p.orphan_timers
        await asyncio.sleep(0.3)  # nothing fails later either
    run(body())


def test_idle_nodes_go_dormant_and_come_back_for_waiting_work() -> None:
    """`idle_for` counts only a node with no lease, no session and no drain; a released
    node is dormant (not gone: it may be added again), still counts as offering its
    tiers, and work waiting for them shows in `waiting_tiers`."""
    async def body() -> None:
        p = Placer(orphan_wait_s=5)
        p.add(NodeInfo("a", 1, ("fake",)))
        p.add(NodeInfo("b", 1, ("fake",)))
        x = await p.acquire("fake", session="s")
        assert p.idle_for(x.node) == 0.0
        p.release(x)
        assert p.idle_for(x.node) == 0.0  # its session lives there
        other = "b" if x.node == "a" else "a"
        await asyncio.sleep(0.05)
        assert p.idle_for(other) >= 0.05
        p.release_idle(other)
        assert other in p.dormant and other not in p.nodes and other not in p.gone
        p.end_session("s")
        p.release_idle(x.node)
        assert p.tiers() == set() and p.offered() == {"fake"}
        p.check_tier("fake")  # dormant nodes still offer it
        waiting = asyncio.ensure_future(p.acquire("fake"))
        await asyncio.sleep(0)
        assert p.waiting_tiers() == {"fake"} and "fake" in p.orphan_timers
        p.add(p.dormant[other])  # admitted again: the waiter is served
        assert (await asyncio.wait_for(waiting, 1)).node == other
        assert other not in p.dormant and not p.orphan_timers
        p.forget_dormant(x.node)  # its machine left the cluster
        assert p.offered() == {"fake"} and not p.dormant
        assert p.stats.nodes_released == 2
    run(body())


def test_idle_release_is_refused_without_the_ray_backend_or_a_positive_time() -> None:
    import subprocess
    import sys
    for cmd in (["eval", "--tasks", "humaneval", "--samples", "none.jsonl", "--out",
                 "none.json"],
                ["train", "none.toml"], ["serve"]):
        p = subprocess.run([sys.executable, "-m", "trialbox.cli", *cmd,
                            "--idle-release-s", "5"], capture_output=True, timeout=60)
        assert p.returncode == 2, (cmd, p.stderr)
        assert b"--idle-release-s releases idle cluster nodes: it needs --backend ray" \
            in p.stderr, (cmd, p.stderr)
    pytest.importorskip("ray")
    from trialbox.cluster.backend import ClusterConfig
    with pytest.raises(UsageError, match="--idle-release-s must be a positive"):
        ClusterConfig(idle_release_s=0)


def test_core_and_the_cli_import_no_ray() -> None:
    """Ray is an optional extra: only `--backend ray` (cluster/backend.py) imports it."""
    import subprocess
    import sys
    code = ("import sys, trialbox.cli, trialbox.cluster.cli, trialbox.cluster.node, "
            "trialbox.cluster.placement; trialbox.cli.build_parser(); "
            "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
