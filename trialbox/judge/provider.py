"""The sandbox provider a judging run uses, for one isolation tier.

    async with judge_provider("gvisor", warm=8) as provider:
        rows, summary = await evaluate(tasks, samples, provider)

Every task of the run is judged in that tier (`trialbox eval --tier`): the tier policy
maps every risk level to it, and the router (sandbox/tiers.py) starts it. A tier this
node cannot run is a `SandboxUnavailable` naming the tier, why (the provider's start
error) and what to change; nothing falls back to another tier. The namespace tier's pool
is a judge pool (`judge_pool_config`: the codec and the stub preloaded in every
sandbox's interpreter); the OCI tiers (gvisor, container) keep `warm` sessions ready.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge.function import judge_pool_config
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.tiers import TierPolicy, TierRouter
from trialbox.types import Risk

TIERS = ("namespace", "gvisor", "container")
"""The tiers a judging run can use."""


def _factories(warm: int, image: str) -> dict[str, Callable[[], Any]]:
    def namespace() -> Any:
        from trialbox.sandbox.pool import CellPool
        return CellPool(judge_pool_config(warm=warm, image=image))

    def gvisor() -> Any:
        from trialbox.sandbox.gvisor import GVisorProvider
        from trialbox.sandbox.oci import OciConfig
        return GVisorProvider(OciConfig(warm=warm, image=image))

    def container() -> Any:
        from trialbox.sandbox.container import ContainerProvider
        from trialbox.sandbox.oci import OciConfig
        return ContainerProvider(OciConfig(warm=warm, image=image))

    return {"namespace": namespace, "gvisor": gvisor, "container": container}


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
