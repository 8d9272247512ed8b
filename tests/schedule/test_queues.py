"""Tiered queues (order, aging, bound), quotas against capacity, the creation rate limit."""

from __future__ import annotations

import asyncio
import time

import pytest

from trialbox.errors import UsageError
from trialbox.schedule.lifecycle import TaskRecord
from trialbox.schedule.queues import QueueFull, TieredQueue
from trialbox.schedule.quotas import Capacity, Quota, RateLimiter, ResourcePool
from trialbox.types import Limits, TaskState


def rec(tid: str, prio: int, t: float = 0.0) -> TaskRecord:
    r = TaskRecord(tid, prio, None, "", t)
    r.state = TaskState.QUEUED
    r.queued_at = t
    return r


def test_tiers_first_then_fifo_within_a_tier():
    q = TieredQueue(3, aging_s=100, max_queued=10)
    for r in (rec("lo1", 2), rec("mid1", 1), rec("lo2", 2), rec("hi1", 0), rec("mid2", 1)):
        q.push(r)
    assert [q.pop(1.0).task_id for _ in range(5)] == ["hi1", "mid1", "mid2", "lo1", "lo2"]
    assert q.pop(1.0) is None and len(q) == 0


def test_aging_lets_old_low_priority_work_overtake_newcomers():
    q = TieredQueue(3, aging_s=10, max_queued=10)
    q.push(rec("old-low", 2, t=0.0))
    q.push(rec("new-mid", 1, t=14.0))
    assert q.effective(q.best(15.0), 15.0) == 1  # old-low waited 15 s: tier 2 -> 1
    assert q.pop(15.0).task_id == "old-low"      # same effective tier, queued first
    q.push(rec("old-low2", 2, t=0.0))
    q.push(rec("new-hi", 0, t=14.0))
    assert q.pop(15.0).task_id == "new-hi"       # tier 0 still wins against an aged tier 1


def test_bound_refuses_new_work_but_takes_back_accepted_work():
    q = TieredQueue(2, aging_s=1, max_queued=2)
    q.push(rec("a", 1))
    q.push(rec("b", 1))
    with pytest.raises(QueueFull, match="max_queued=2"):
        q.push(rec("c", 1))
    q.push(rec("preempted", 1), front=True, force=True)
    assert len(q) == 3 and q.pop(0).task_id == "preempted"
    with pytest.raises(UsageError, match="priority 5"):
        q.push(rec("x", 5), force=True)


def test_discarded_entries_are_skipped():
    q = TieredQueue(1, aging_s=1, max_queued=5)
    a, b = rec("a", 0), rec("b", 0)
    q.push(a)
    q.push(b)
    a.state = TaskState.CANCELLED
    q.discard(a)
    q.discard(a)  # twice, or for a task not in the queue: no-op
    assert len(q) == 1 and q.pop(0) is b and len(q) == 0
    q.discard(b)
    assert len(q) == 0
    with pytest.raises(UsageError, match="already queued"):
        q.push(a, force=True)
        q.push(a, force=True)


def test_quota_larger_than_usable_capacity_is_refused_with_what_to_change():
    pool = ResourcePool(Capacity(cpus=2, memory_mb=24_000, disk_mb=100_000), reserve=0.3)
    assert pool.usable.cpus == pytest.approx(1.4)
    with pytest.raises(UsageError, match="cpus=2.0 exceeds this machine's usable cpus"):
        pool.check(Quota())  # the reference 2 vCPU quota on a 2-core machine
    pool.check(Quota.of(Limits(cpus=1.0)))
    with pytest.raises(UsageError, match="reserve"):
        Capacity(1, 1, 1).usable(1.5)
    with pytest.raises(UsageError):
        Quota(cpus=-1)
    detected = Capacity.detect()
    assert detected.cpus >= 1 and detected.memory_mb > 0


def test_reservations_wait_first_come_first_served():
    async def body():
        pool = ResourcePool(Capacity(cpus=4, memory_mb=1000, disk_mb=1000), reserve=0.0)
        big, small = Quota(cpus=3, memory_mb=1, disk_mb=1), Quota(cpus=1, memory_mb=1,
                                                                   disk_mb=1)
        await pool.acquire(big)
        order: list[str] = []

        async def want(name: str, q: Quota) -> None:
            await pool.acquire(q)
            order.append(name)

        t1 = asyncio.ensure_future(want("big", big))
        await asyncio.sleep(0)
        t2 = asyncio.ensure_future(want("small", small))  # fits now, but big came first
        await asyncio.sleep(0.01)
        assert order == [] and pool.waiting == 2
        pool.release(big)
        await asyncio.gather(t1, t2)
        assert order == ["big", "small"] and pool.cpus == 4
        # a cancelled waiter leaves nothing reserved
        t3 = asyncio.ensure_future(pool.acquire(small))
        await asyncio.sleep(0.01)
        t3.cancel()
        await asyncio.gather(t3, return_exceptions=True)
        pool.release(big)
        pool.release(small)
        assert pool.cpus == 0 and pool.waiting == 0

    asyncio.run(body())


def test_rate_limiter_spaces_creations():
    async def body():
        rl = RateLimiter(rate=100, burst=2)
        t0 = time.monotonic()
        for _ in range(7):
            await rl.take()
        return time.monotonic() - t0

    # 2 at once, then 5 more at 100/s: at least 50 ms (slowness only adds to it)
    assert asyncio.run(body()) >= 0.045
    with pytest.raises(UsageError):
        RateLimiter(rate=0)
