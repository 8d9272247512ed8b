"""The sandbox provider a judging run uses, for one isolation tier.

    async with judge_provider("gvisor", warm=8) as provider:
        rows, summary = await evaluate(tasks, samples, provider)

Every task of the run is judged in that tier (`trialbox eval --tier`): the tier policy
maps every risk level to it, and the router (sandbox/tiers.py) starts it. A tier this
node cannot run is a `SandboxUnavailable` naming the tier, why (the provider's start
error) and what to change; nothing falls back to another tier. The namespace tier's pool
is a judge pool (`judge_pool_config`: the codec and the stub preloaded in every
sandbox's interpreter); the OCI tiers (gvisor, container) keep `warm` sessions ready,
with the same modules preloaded in their fork servers (`OciConfig.preload_sources`),
and gvisor hands a judged attempt a recycled sandbox (oci.Engine.recycle): a warm run,
not a cold start.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from trialbox.errors import UsageError
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.tiers import TierPolicy, TierRouter
from trialbox.types import Limits, Risk, Task

TIERS = ("namespace", "gvisor", "container")
"""The tiers a judging run can use."""


def _factories(warm: int, image: str) -> dict[str, Callable[[], Any]]:
    from trialbox.judge.function import judge_pool_config  # function.py imports this module

    def namespace() -> Any:
        from trialbox.sandbox.pool import CellPool
        return CellPool(judge_pool_config(warm=warm, image=image))

    def oci_config() -> Any:  # the judge's codec, stub and harness preloaded, as above
        from trialbox.sandbox.oci import OciConfig
        judge = judge_pool_config()
        return OciConfig(warm=warm, image=image, preload=judge.preload,
                         preload_sources=judge.preload_sources)

    def gvisor() -> Any:
        from trialbox.sandbox.gvisor import GVisorProvider
        return GVisorProvider(oci_config())

    def container() -> Any:
        from trialbox.sandbox.container import ContainerProvider
        return ContainerProvider(oci_config())

    return {"namespace": namespace, "gvisor": gvisor, "container": container}


def make_provider(tier: str, *, warm: int = 8, image: str = "") -> Any:
    """The judging provider of `tier`, not started (`await p.start()`, `await p.close()`):
    what `judge_provider` starts, for a caller that holds it across several runs."""
    if tier not in TIERS:
        raise UsageError(f"unknown tier {tier!r}; use one of {', '.join(TIERS)}")
    return _factories(warm, image)[tier]()


@asynccontextmanager
async def judge_provider(tier: str = "namespace", *, warm: int = 8,
                         image: str = "") -> AsyncIterator[SandboxProvider]:
    """A started provider of `tier` with `warm` sessions kept ready, closed on exit;
    `image`: a built image's directory its sandboxes run (docs/images.md; default the
    host's runtime)."""
    if tier not in TIERS:
        raise UsageError(f"unknown tier {tier!r}; use one of {', '.join(TIERS)}")
    if isinstance(warm, bool) or not isinstance(warm, int) or not 0 <= warm <= 64:
        raise UsageError(f"warm must be an int in 0..64, got {warm!r}")
    policy = TierPolicy(routine=tier, untrusted=tier, hostile=tier)
    router = await TierRouter.start(policy, _factories(warm, image))
    try:
        yield router.provider_for(Risk.ROUTINE)
    finally:
        await router.close()


def candidate_limits(limits: Limits, task: Task) -> Limits:
    """The limits a candidate's sandbox for `task` opens with: `limits` plus the task's
    allow-list (`Task.net_allow`, from its task file); the trusted side never gets it."""
    return limits.with_(net_allow=task.net_allow) if task.net_allow else limits
