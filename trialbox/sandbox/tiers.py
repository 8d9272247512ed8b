"""Risk → tier: which isolation tier a task's candidates run in, and the router that hands
out the provider for it — never a weaker tier than the policy says.

    router = await TierRouter.start(TierPolicy())      # starts the tiers the policy names
    try:
        provider = router.provider_for(task)           # by task.risk
        async with await provider.open(Limits(wall_s=2)) as sb: ...
    finally:
        await router.close()

A risk whose tier this node does not offer is a `SandboxUnavailable` naming the task,
the risk, the tier, why the node lacks it (the provider's start error, or doctor's
verdict) and what to change (install what is missing, or map the risk to a tier the
node offers); it never falls back to another tier.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from trialbox.errors import SandboxUnavailable, TrialboxError, UsageError
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.doctor import NodeReport
from trialbox.types import Risk, Task

STRENGTH = {"fake": 0, "namespace": 1, "container": 1, "gvisor": 2}
"""How strong each tier's wall is: the host kernel (namespace, container) < a kernel of
the sandbox's own (gvisor). `fake` isolates nothing (tests of the layers above)."""


@dataclass(frozen=True)
class TierPolicy:
    """Which tier runs each risk level. A riskier level may not map to a weaker tier than
    a safer one (that would be a downgrade written into the config)."""

    routine: str = "namespace"
    """Tier for `Risk.ROUTINE` tasks (the default risk)."""
    untrusted: str = "gvisor"
    """Tier for `Risk.UNTRUSTED` tasks."""
    hostile: str = "gvisor"
    """Tier for `Risk.HOSTILE` tasks."""

    def __post_init__(self) -> None:
        for f in fields(self):
            tier = getattr(self, f.name)
            if tier not in STRENGTH:
                raise UsageError(f"TierPolicy.{f.name}={tier!r} is not a tier; use one of "
                                 f"{', '.join(t for t in STRENGTH if t != 'fake')}")
        levels = [r.value for r in Risk]  # safest first
        for lower, higher in itertools.pairwise(levels):
            a, b = getattr(self, lower), getattr(self, higher)
            if STRENGTH[b] < STRENGTH[a]:
                raise UsageError(f"TierPolicy maps {higher} to {b!r}, a weaker tier than "
                                 f"{lower}'s {a!r}; give {higher} a tier at least as strong "
                                 f"(e.g. {higher}={a!r})")

    def tier_for(self, risk: Risk) -> str:
        if not isinstance(risk, Risk):
            raise UsageError(f"risk must be a trialbox.types.Risk, got {risk!r}; one of "
                             f"{', '.join(r.name for r in Risk)}")
        return str(getattr(self, risk.value))

    @property
    def tiers(self) -> list[str]:
        """The tiers this policy uses, each once, in risk order."""
        return list(dict.fromkeys(self.tier_for(r) for r in Risk))


def _default_factory(tier: str) -> Any:
    if tier == "namespace":
        from trialbox.sandbox.pool import CellPool, PoolConfig
        return CellPool(PoolConfig())
    if tier == "gvisor":
        from trialbox.sandbox.gvisor import GVisorProvider
        return GVisorProvider()
    if tier == "container":
        from trialbox.sandbox.container import ContainerProvider
        return ContainerProvider()
    raise UsageError(f"no provider is built for tier {tier!r}; pass one in `providers`")


class TierRouter:
    """The providers a node offers, and the policy choosing among them.

    `providers` are the started providers this node offers (each keyed by its own
    `tier`); `missing` says, for a tier the node lacks, why and how to fix it: a
    mapping tier -> reason, or `trialbox doctor`'s `NodeReport` (`await diagnose()`)."""

    def __init__(self, providers: Iterable[SandboxProvider], policy: TierPolicy | None = None,
                 missing: Mapping[str, str] | NodeReport | None = None):
        self.policy = policy or TierPolicy()
        self.providers: dict[str, SandboxProvider] = {}
        for p in providers:
            if not isinstance(p, SandboxProvider):
                raise UsageError(f"{type(p).__name__} is not a SandboxProvider (tier, "
                                 f"runtime, open(limits))")
            if p.tier in self.providers:
                raise UsageError(f"two providers of tier {p.tier!r}; give one per tier")
            self.providers[p.tier] = p
        if isinstance(missing, NodeReport):  # doctor's verdicts: "container (runc)" -> tier
            runs = {t.tier.split(" ")[0] for t in missing.tiers if t.ok}
            missing = {t.tier.split(" ")[0]: t.reason + (f" (fix: {t.fix})" if t.fix else "")
                       for t in missing.tiers
                       if not t.ok and t.tier.split(" ")[0] not in runs}
        self.missing = dict(missing or {})
        self._owned: list[Any] = []

    @classmethod
    async def start(cls, policy: TierPolicy | None = None,
                    factories: Mapping[str, Callable[[], Any]] | None = None) -> TierRouter:
        """Start a provider for each tier the policy uses. A tier that fails to start is
        recorded with the reason (its start error) and refused when a task needs it;
        the others still serve. `factories` replaces how a tier's provider is built."""
        policy = policy or TierPolicy()
        started: list[Any] = []
        missing: dict[str, str] = {}
        for tier in policy.tiers:
            make = (factories or {}).get(tier)
            provider = make() if make is not None else _default_factory(tier)
            try:
                started.append(await _start(provider))
            except (TrialboxError, OSError) as e:
                missing[tier] = f"{type(e).__name__}: {e}"
                await _close(provider)
        router = cls(started, policy, missing)
        router._owned = started
        return router

    def provider_for(self, task: Task | Risk) -> SandboxProvider:
        """The provider of the tier the policy gives this task's risk (or this risk)."""
        if isinstance(task, Task):
            risk, who = task.risk, f"task {task.task_id!r} is {task.risk.value}"
        else:
            risk, who = task, f"risk {getattr(task, 'value', task)!r}"
        tier = self.policy.tier_for(risk)
        provider = self.providers.get(tier)
        if provider is not None:
            return provider
        why = self.missing.get(tier, "no provider of that tier was given to the router")
        offered = ", ".join(sorted(self.providers)) or "none"
        raise SandboxUnavailable(
            f"{who}, which the tier policy runs in the {tier} tier, and this node does not "
            f"offer {tier}: {why}. Fix what is missing (`trialbox doctor` says how), or map "
            f"{risk.value} to a tier this node offers ({offered}) with "
            f"TierPolicy({risk.value}=...); trialbox never runs it in a weaker tier")

    async def close(self) -> None:
        """Close the providers `start` started (those passed in stay the caller's)."""
        owned, self._owned = self._owned, []
        for p in owned:
            await _close(p)

    async def __aenter__(self) -> TierRouter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _start(provider: Any) -> Any:
    start: Callable[[], Awaitable[Any]] | None = getattr(provider, "start", None)
    if start is not None:
        await start()
    return provider


async def _close(provider: Any) -> None:
    close: Callable[[], Awaitable[Any]] | None = getattr(provider, "close", None)
    if close is not None:
        await close()


def check_routable(tasks: Iterable[Task], offered: Mapping[str, str | None],
                   policy: TierPolicy | None = None) -> None:
    """Refuse, before anything runs, a task set holding a task whose risk maps (by
    `policy`) to a tier not in `offered` — tier -> None when it serves, or the reason
    it does not. The error names the first such task, as `TierRouter.provider_for` does.

    >>> from trialbox.types import TaskKind
    >>> check_routable([Task("t", TaskKind.STDIO, "p")], {"namespace": None})
    """
    policy = policy or TierPolicy()
    serving = sorted(t for t, why in offered.items() if why is None)
    for task in tasks:
        tier = policy.tier_for(task.risk)
        if offered.get(tier, "") is None:
            continue
        why = offered.get(tier) or "no provider of that tier was given"
        raise SandboxUnavailable(
            f"task {task.task_id!r} is {task.risk.value}, which the tier policy runs in the "
            f"{tier} tier, and {tier} is not offered here: {why}. Run it where {tier} is "
            f"offered, or map {task.risk.value} to a tier offered here "
            f"({', '.join(serving) or 'none'}) with TierPolicy({task.risk.value}=...); "
            "trialbox never runs it in a weaker tier")


def with_risk(tasks: Iterable[Task], risk: Risk) -> list[Task]:
    """A task set declared at one risk level (e.g. an exploit catalogue: HOSTILE)."""
    if not isinstance(risk, Risk):
        raise UsageError(f"risk must be a trialbox.types.Risk, got {risk!r}")
    return [replace(t, risk=risk) for t in tasks]
