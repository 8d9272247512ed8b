"""The lease seam: an episode keeps its files across leases, holds compute only inside
one, and its session closes at `end()` — on the fake and on the real namespace tier."""

from __future__ import annotations

import asyncio

import pytest

from tests.sandbox.conftest import no_leaks
from trialbox.errors import UsageError
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.sandbox.fake import FakeSandbox
from trialbox.schedule.lease import DirectLeaser
from trialbox.types import ExecStatus, Limits


def test_direct_leaser_on_the_fake():
    opened: list[FakeSandbox] = []

    async def opener(limits):
        sb = FakeSandbox(limits=limits)
        opened.append(sb)
        return sb

    async def body():
        leaser = DirectLeaser(opener)
        async with leaser.lease("ep-1") as sb:
            await sb.write_file("a.txt", b"1")
        async with leaser.lease("ep-1") as sb2:
            assert sb2 is sb and await sb2.read_file("a.txt") == b"1"
        async with leaser.lease("ep-2"):
            pass
        assert len(opened) == 2 and opened[0].parks == 2
        assert leaser.open_sessions == 2
        await leaser.end("ep-1")
        await leaser.end("ep-1")  # idempotent
        assert opened[0].closed and not opened[1].closed
        await leaser.close()
        assert opened[1].closed
        assert (leaser.stats.leases, leaser.stats.sessions_opened,
                leaser.stats.sessions_closed) == (3, 2, 2)
        with pytest.raises(UsageError):
            async with leaser.lease(""):
                pass

    asyncio.run(body())


def test_leases_of_one_episode_never_overlap():
    async def body():
        leaser = DirectLeaser(lambda limits: _fake(limits))
        inside = 0
        peak = 0

        async def turn():
            nonlocal inside, peak
            async with leaser.lease("ep"):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.01)
                inside -= 1

        await asyncio.gather(*(turn() for _ in range(5)))
        assert peak == 1
        await leaser.close()

    asyncio.run(body())


async def _fake(limits):
    return FakeSandbox(limits=limits)


def test_direct_leaser_on_the_namespace_tier(runner):
    """Files survive between leases; between them the session holds no cell."""
    async def opener(limits):
        return await NamespaceSandbox.open(runner.pool, limits)

    async def body():
        leaser = DirectLeaser(opener)
        async with leaser.lease("ep", Limits(wall_s=5)) as sb:
            r = await run_code(sb, "open('state.txt', 'w').write('turn 1')")
            assert r.status is ExecStatus.OK, r.stderr
        assert isinstance(sb, NamespaceSandbox) and sb.parked
        async with leaser.lease("ep") as sb:
            r = await run_code(sb, "print(open('state.txt').read())")
            assert r.stdout == b"turn 1\n", r.stderr
        await leaser.end("ep")
        assert sb.closed

    runner.run(body())
    no_leaks(runner)


def test_quota_waiters_are_served_by_priority_then_arrival():
    from trialbox.schedule.quotas import Capacity, Quota, ResourcePool

    async def body():
        pool = ResourcePool(Capacity(cpus=1, memory_mb=1000, disk_mb=1000), reserve=0)
        q = Quota(cpus=1, memory_mb=1, disk_mb=1)
        await pool.acquire(q)  # the machine is full
        order: list[str] = []

        async def want(name, prio):
            async with pool.hold(q, prio):
                order.append(name)
                await asyncio.sleep(0)

        waiters = [asyncio.ensure_future(want(n, p)) for n, p in
                   (("train-b", (2, 9)), ("eval", (1, 50)), ("train-a", (2, 3)),
                    ("interactive", (0, 99)), ("train-a2", (2, 3)))]
        await asyncio.sleep(0)
        pool.release(q)
        await asyncio.gather(*waiters)
        assert order == ["interactive", "eval", "train-a", "train-a2", "train-b"]
        assert pool.cpus == 0

    asyncio.run(body())


def test_a_lease_inside_its_episode_s_slot_reserves_nothing_more():
    from trialbox.schedule.leasing import SchedulerLeaser
    from trialbox.schedule.quotas import Capacity, ResourcePool

    async def body():
        pool = ResourcePool(Capacity(cpus=1, memory_mb=1000, disk_mb=1000), reserve=0)
        leaser = SchedulerLeaser(pool, opener=_fake,
                                 default_limits=Limits(cpus=1, memory_mb=100, disk_mb=10))
        async with leaser.slot("ep"):
            assert pool.cpus == 1  # the turn's reservation
            async with leaser.lease("ep") as sb:  # its own run: no second reservation
                assert pool.cpus == 1 and isinstance(sb, FakeSandbox)
            other = asyncio.ensure_future(_lease_once(leaser, "other"))
            await asyncio.sleep(0.01)
            assert not other.done()  # another episode waits for the capacity
        await asyncio.wait_for(other, 1)
        assert pool.cpus == 0 and leaser._holding == {}
        await leaser.close()

    asyncio.run(body())


async def _lease_once(leaser, episode):
    async with leaser.lease(episode):
        pass
