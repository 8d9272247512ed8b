"""The sandbox provider a judging run uses, for one isolation tier.

    async with judge_provider("gvisor", warm=8) as provider:
        rows, summary = await evaluate(tasks, samples, provider)

Every candidate of the run is judged in that tier (`trialbox eval --tier`): the tier
policy maps every risk level to it, and the router (sandbox/tiers.py) starts it. A tier
this node cannot run is a `SandboxUnavailable` naming the tier, why (the provider's start
error) and what to change; nothing falls back to another tier.

The trusted harness is not the candidate: on the gvisor and container tiers it runs on
the namespace tier (`HARNESS_TIER`, a judge pool of its own, with its own limits), so a
judged attempt costs one gVisor run, not two (`SplitProvider`; docs/tiers.md). Where the
namespace tier cannot start, the harness stays on the candidate's tier, as before, and a
warning says so; the candidate's tier never changes. The namespace tier's pool
is a judge pool (`judge_pool_config`: the codec and the stub preloaded in every
sandbox's interpreter); the OCI tiers (gvisor, container) keep `warm` sessions ready,
with the same modules preloaded in their fork servers (`OciConfig.preload_sources`),
and gvisor hands a judged attempt a recycled sandbox (oci.Engine.recycle): a warm run,
not a cold start.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from trialbox.errors import TrialboxError, UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider, passes_fds, preloaded_modules
from trialbox.sandbox.tiers import TierPolicy, TierRouter
from trialbox.types import Limits, Risk, Runtime, Task

log = logging.getLogger("trialbox.judge.provider")

TIERS = ("namespace", "gvisor", "container")
"""The tiers a judging run can use."""
CANDIDATE_MODULES = frozenset({"_trialbox_codec", "_trialbox_stub"})
"""The judge's modules a candidate's interpreter imports (function._STUB_MODULES)."""
HARNESS_TIER = "namespace"
"""Where the trusted harness runs when candidates run in a slower tier: it is trusted
code (the task's tests), still sandboxed with `JudgeConfig.harness_limits`, and this
tier's run costs ~1-3 ms where a gVisor run costs ~15-35."""


class SplitProvider:
    """Candidates from one provider, the trusted harness's sessions from another: a
    `SandboxProvider` whose `open` is the candidate's (tier, runtime, preloaded modules
    are the candidate provider's), with the harness's provider as `harness`, which
    `function.open_harness` uses (`harness_provider`). The judge's socketpair is made by
    the supervisor and one end handed to a session of each; both tiers pass fds.

        split = SplitProvider(GVisorProvider(cfg), CellPool(judge_pool_config()))
        await split.start()   # the candidate's provider must start; if the harness's
                              # cannot, the harness shares the candidate's (logged)

    `start` and `close` start and close both; a candidate provider already started
    (the router's) is given with `own_candidate=False`, and stays the caller's."""

    passes_fds = True  # checked against both sides in __init__

    def __init__(self, candidate: Any, harness: Any, *, own_candidate: bool = True):
        if not passes_fds(candidate) or not passes_fds(harness):
            raise UsageError("SplitProvider: both providers must pass fds (the candidate "
                             "and the harness talk over a socketpair)")
        self.candidate = candidate
        self.harness: Any = harness
        """The trusted harness's provider (the candidate's when its own could not start)."""
        self.own_candidate = own_candidate
        self.tier: str = candidate.tier
        """The candidates' tier: the tier of this provider's sessions."""
        self.runtime: Runtime = getattr(candidate, "runtime", None)  # type: ignore[assignment]
        """The candidates' environment (the provider's once started)."""

    @property
    def preloaded_modules(self) -> frozenset[str]:
        return preloaded_modules(self.candidate)

    def __getattr__(self, name: str) -> Any:
        """Anything else is the candidates' provider's (its `engine`, `id`, `cgroups`,
        `config`): a caller that inspected the tier's provider still sees that tier."""
        candidate = self.__dict__.get("candidate")
        if candidate is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(candidate, name)

    @property
    def parts(self) -> tuple[Any, ...]:
        """The distinct providers behind this one (for CPU accounting, settling)."""
        return (self.candidate,) if self.harness is self.candidate else (
            self.candidate, self.harness)

    async def open(self, limits: Limits | None = None) -> Sandbox:
        """A candidate's session."""
        sb: Sandbox = await self.candidate.open(limits)
        return sb

    async def start(self) -> SplitProvider:
        """Start the candidate's provider (its failure is the caller's), then the
        harness's; a harness provider that cannot start, or runs another environment,
        is closed and the harness shares the candidate's provider (a warning says so)."""
        if self.own_candidate:
            await self.candidate.start()
        self.runtime = self.candidate.runtime
        if self.harness is self.candidate:
            return self
        try:
            await self.harness.start()
            why = _mismatch(self.candidate, self.harness)
        except (TrialboxError, OSError) as e:
            why = f"the {self.harness.tier} tier could not start ({type(e).__name__}: {e})"
        if why:
            harness, self.harness = self.harness, self.candidate
            await harness.close()
            log.warning("judge: %s; the trusted harness runs on the %s tier too, as the "
                        "candidates do (two %s runs per attempt)", why, self.tier,
                        self.tier)
        return self

    async def settle(self, timeout: float = 10.0) -> None:
        for p in self.parts:
            settle = getattr(p, "settle", None)
            if settle is not None:
                await settle(timeout)

    async def close(self) -> None:
        harness, self.harness = self.harness, self.candidate
        if harness is not self.candidate:
            await harness.close()
        if self.own_candidate:
            await self.candidate.close()

    async def __aenter__(self) -> SplitProvider:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def harness_provider(pool: Any) -> Any:
    """The provider the trusted harness's sessions come from: `pool.harness` when `pool`
    is a `SplitProvider`, else `pool` itself (both sides in one tier)."""
    return pool.harness if isinstance(pool, SplitProvider) else pool


def _mismatch(candidate: Any, harness: Any) -> str:
    """Why `harness` cannot judge `candidate`'s sessions, or "": the harness runs the
    task's test code, so it must run the same environment."""
    a, b = candidate.runtime, harness.runtime
    if a.id != b.id:
        return (f"the {harness.tier} tier runs {b.id}, not the candidates' environment "
                f"{a.id}")
    return ""


def _factories(warm: int, image: str) -> dict[str, Callable[[], Any]]:
    from trialbox.judge.function import judge_pool_config  # function.py imports this module

    def namespace() -> Any:
        from trialbox.sandbox.pool import CellPool
        return CellPool(judge_pool_config(warm=warm, image=image))

    def oci_config(sources: tuple[tuple[str, str], ...] | None = None) -> Any:
        from trialbox.sandbox.oci import OciConfig  # the judge's modules preloaded
        judge = judge_pool_config()
        return OciConfig(warm=warm, image=image, preload=judge.preload,
                         preload_sources=judge.preload_sources if sources is None
                         else sources)

    def gvisor() -> Any:
        from trialbox.sandbox.gvisor import GVisorProvider
        # The candidate's codec and stub only: each page of the fork server's heap is
        # copied per run under gVisor (a fork there costs ~28 ms of CPU with the
        # harness preloaded, ~24.5 without; docs/tiers.md). The harness runs on the
        # namespace tier; if it ever runs here (no namespace tier), it imports its
        # module from the workspace, where open_harness always writes it.
        return GVisorProvider(oci_config(tuple(
            s for s in judge_pool_config().preload_sources if s[0] in CANDIDATE_MODULES)))

    def container() -> Any:
        from trialbox.sandbox.container import ContainerProvider
        return ContainerProvider(oci_config())

    return {"namespace": namespace, "gvisor": gvisor, "container": container}


def _harness_warm(warm: int) -> int:
    """Warm harness sessions: an evaluation opens one per worker and keeps it (the
    callers' `warm` is 2 per worker); a judgement without a shared harness opens one."""
    return max(1, warm // 2)


def make_provider(tier: str, *, warm: int = 8, image: str = "", split: bool = True) -> Any:
    """The judging provider of `tier`, not started (`await p.start()`, `await p.close()`):
    what `judge_provider` starts, for a caller that holds it across several runs.
    `split`: on a tier other than `HARNESS_TIER`, a `SplitProvider` whose harness runs
    there (False: the harness shares the candidate's tier)."""
    if tier not in TIERS:
        raise UsageError(f"unknown tier {tier!r}; use one of {', '.join(TIERS)}")
    candidate = _factories(warm, image)[tier]()
    if not split or tier == HARNESS_TIER:
        return candidate
    return SplitProvider(candidate, _factories(_harness_warm(warm), image)[HARNESS_TIER]())


@asynccontextmanager
async def judge_provider(tier: str = "namespace", *, warm: int = 8,
                         image: str = "", split: bool = True
                         ) -> AsyncIterator[SandboxProvider]:
    """A started provider of `tier` with `warm` sessions kept ready, closed on exit;
    `image`: a built image's directory its sandboxes run (docs/images.md; default the
    host's runtime). `split`: as in `make_provider` — the candidates in `tier`, the
    trusted harness on `HARNESS_TIER` (or in `tier` too, logged, if it cannot start)."""
    if tier not in TIERS:
        raise UsageError(f"unknown tier {tier!r}; use one of {', '.join(TIERS)}")
    if isinstance(warm, bool) or not isinstance(warm, int) or not 0 <= warm <= 64:
        raise UsageError(f"warm must be an int in 0..64, got {warm!r}")
    policy = TierPolicy(routine=tier, untrusted=tier, hostile=tier)
    router = await TierRouter.start(policy, _factories(warm, image))
    try:
        provider = router.provider_for(Risk.ROUTINE)  # the candidates' tier, or raise
        if not split or tier == HARNESS_TIER:
            yield provider
            return
        harness = _factories(_harness_warm(warm), image)[HARNESS_TIER]()
        async with SplitProvider(provider, harness, own_candidate=False) as split_provider:
            yield split_provider
    finally:
        await router.close()


def candidate_limits(limits: Limits, task: Task) -> Limits:
    """The limits a candidate's sandbox for `task` opens with: `limits` plus the task's
    allow-list (`Task.net_allow`, from its task file); the trusted side never gets it."""
    return limits.with_(net_allow=task.net_allow) if task.net_allow else limits
