"""One started provider of each isolation tier, for the suites that run the same attack
on every tier (test_k_shared_with_host.py, test_l_tier_views.py).

`Tier(name)` starts the provider on an event loop of its own: `namespace` (a CellPool,
the C hot path), `namespace:python` (the zygote's Python path), `container` (runc),
`container:crun`, `gvisor`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from tests.sandbox.conftest import FAST
from trialbox.sandbox import CellPool, PoolConfig, run_code
from trialbox.sandbox.container import ContainerProvider
from trialbox.sandbox.gvisor import GVisorProvider
from trialbox.sandbox.oci import OciConfig
from trialbox.types import ExecResult

T = TypeVar("T")
TIERS = ["namespace", "container", "container:crun", "gvisor"]
"""One provider of each tier (the namespace tier on its C path)."""


class Tier:
    """One started provider of a tier and the event loop it lives on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        tier, _, variant = name.partition(":")
        self.kind = tier
        """`namespace`, `container` or `gvisor`."""
        if tier == "namespace":
            pool = CellPool(PoolConfig(warm=1, native="off" if variant == "python"
                                       else "auto"))
            self.provider: Any = self.run(pool.start())
            self.state = [pool.dir, pool.config.state_dir]
        else:
            p = (GVisorProvider(OciConfig(warm=1)) if tier == "gvisor"
                 else ContainerProvider(OciConfig(warm=1), runtime=variant or "runc"))
            self.provider = self.run(p.start())
            self.state = [p.dir, p.config.state_dir]

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def one(self, code: str, lang: str = "python", **changes: Any) -> ExecResult:
        """A fresh session, one run of `code`, the session closed."""
        async def body() -> ExecResult:
            async with await self.provider.open(FAST.with_(**changes)) as sb:
                return await run_code(sb, code, lang)
        return self.run(body())

    @property
    def template(self) -> str:
        """Host directory of the sandboxes' root skeleton (/etc/hostname, ...)."""
        return str(self.provider.root if self.kind == "namespace" else self.provider.rootfs)

    @property
    def dev_nodes(self) -> str | None:
        """Host directory of the device nodes the sandboxes' /dev shows (None: gVisor
        makes its own)."""
        if self.kind == "namespace":
            return str(self.provider.dev)
        return str(self.provider.dev_dir) if self.kind == "container" else None

    @property
    def python(self) -> str:
        """The host file of the interpreter Python candidates run in."""
        return os.path.realpath(str(self.provider.runtime.python))

    def close(self) -> None:
        self.run(self.provider.close())
        self.loop.close()
