"""Isolated execution of untrusted, model-written code, behind one small interface.

    from trialbox.sandbox import open_sandbox, run, Limits

    result = await run("print(1 + 1)")                    # one shot, Python
    async with await open_sandbox(limits=Limits(wall_s=2)) as sb:   # a session
        await sb.write_file("a.txt", b"kept across runs")
        r1 = await sb.exec(["cat", "a.txt"])

Tiers: `namespace` (the embedded default; see namespace.py and supervisor.py for a
session and its runs, pool.py for the warm pool, zygote_client.py and zygote.py for the
cells, reaper.py for what dead pools left), `gvisor` (gVisor's user-space kernel,
gvisor.py) and `container` (runc/crun, container.py), the last two over OCI bundles
(oci.py); `trialbox doctor` says which this node can run (doctor.py). A tier the node
lacks is an error, never a fallback. The interface lives in base.py; `FakeSandbox`
(fake.py) stands in for it in upper layers' tests.
"""

from __future__ import annotations

import asyncio
import atexit
from collections.abc import Mapping, Sequence
from typing import Any

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox, SessionSnapshot
from trialbox.sandbox.languages import LANGUAGES, language, run_code
from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.sandbox.pool import CellPool, PoolConfig
from trialbox.types import ExecResult, ExecStatus, Limits

__all__ = ["Sandbox", "NamespaceSandbox", "CellPool", "PoolConfig", "Limits", "ExecResult",
           "ExecStatus", "LANGUAGES", "language", "run_code", "open_sandbox", "run",
           "default_pool", "default_provider", "TIERS"]

TIERS = ("namespace", "gvisor", "container")

_pools: dict[asyncio.AbstractEventLoop, CellPool] = {}
_providers: dict[tuple[asyncio.AbstractEventLoop, str], Any] = {}


async def default_provider(tier: str) -> Any:
    """The process's `gvisor` or `container` provider for the running event loop, started
    on first use. Raises SandboxUnavailable naming what the node lacks (never a fallback
    to another tier)."""
    loop = asyncio.get_running_loop()
    for (other, name), old in list(_providers.items()):
        if other.is_closed():
            old.close_sync()
            del _providers[(other, name)]
    provider = _providers.get((loop, tier))
    if provider is None or provider.closed:
        if tier == "gvisor":
            from trialbox.sandbox.gvisor import GVisorProvider
            provider = GVisorProvider()
        else:
            from trialbox.sandbox.container import ContainerProvider
            provider = ContainerProvider()
        await provider.start()
        _providers[(loop, tier)] = provider
    return provider


async def default_pool(config: PoolConfig | None = None) -> CellPool:
    """The process's pool for the running event loop, started on first use and closed
    at interpreter exit (pools bound to closed loops are closed on the next call)."""
    loop = asyncio.get_running_loop()
    for other, old in list(_pools.items()):
        if other.is_closed():
            old.close_sync()
            del _pools[other]
    pool = _pools.get(loop)
    if pool is None or pool.closed:
        pool = CellPool(config)
        _pools[loop] = pool
        await pool.start()
    return pool


@atexit.register
def _close_pools() -> None:
    for pool in _pools.values():
        pool.close_sync()
    _pools.clear()
    for provider in _providers.values():
        provider.close_sync()
    _providers.clear()


async def open_sandbox(tier: str = "namespace", limits: Limits | None = None,
                       pool: CellPool | None = None,
                       from_snapshot: SessionSnapshot | None = None) -> Sandbox:
    """Open a session in the given tier. Close it (or use `async with`) when done.
    `from_snapshot`: a fork of that snapshot (its files, copy-on-write; docs/snapshots.md)."""
    if from_snapshot is not None:
        if from_snapshot.tier != tier:
            raise UsageError(f"the snapshot is of the {from_snapshot.tier} tier; open its "
                             f"forks with tier={from_snapshot.tier!r}")
        return await from_snapshot.open(limits)
    if tier not in TIERS:
        raise UsageError(f"unknown sandbox tier {tier!r}; available: {', '.join(TIERS)}")
    if limits is not None and not isinstance(limits, Limits):
        raise UsageError(f"limits must be a trialbox.types.Limits, got {type(limits).__name__}")
    if tier != "namespace":
        if pool is not None:
            raise UsageError(f"pool= is the namespace tier's; the {tier} tier takes none")
        provider = await default_provider(tier)
        return await provider.open(limits)  # type: ignore[no-any-return]
    return await NamespaceSandbox.open(pool or await default_pool(), limits)


async def run(code: str | bytes, language: str = "python", *, stdin: bytes = b"",
              args: Sequence[str] = (), limits: Limits | None = None,
              files: Mapping[str, bytes] | None = None, tier: str = "namespace",
              pool: CellPool | None = None) -> ExecResult:
    """One-shot: open a session, write `files`, run `code`, close the session."""
    sb = await open_sandbox(tier, limits, pool)
    try:
        for path, data in (files or {}).items():
            await sb.write_file(path, data)
        return await run_code(sb, code, language, stdin=stdin, args=args, limits=limits)
    finally:
        await sb.close()
