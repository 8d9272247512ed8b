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
