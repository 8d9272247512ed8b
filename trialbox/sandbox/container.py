"""The `container` tier: sessions in OCI containers run by `runc` or `crun`.

Same kernel as the host (like the namespace tier), but built the standard way from an
OCI bundle, so the same bundle runs under any OCI runtime (and under Kubernetes'
RuntimeClasses: docs/tiers.md). The session machinery is oci.py's; each container has a
user namespace (container uid 0-65535 -> a block of host uids of the session's own,
owned by the first of them: userns.py), its own network namespace (loopback only), a
read-only root, the session's cgroup (memory, CPU, pids limits from the host kernel)
and runs drop to uid 1000 with the namespace tier's seccomp deny-list.

`crun` refuses this host's hybrid cgroup layout (v1 controllers plus an empty cgroup2
mount): it runs in a private mount namespace with the cgroup2 mount hidden.
"""

from __future__ import annotations

import shutil

from trialbox.errors import UsageError
from trialbox.sandbox import procview
from trialbox.sandbox.oci import Engine, OciConfig, OciProvider

RUNTIMES = {"runc": "/usr/sbin/runc", "crun": "/usr/bin/crun"}


def _hybrid_cgroups() -> bool:
    """True when a cgroup2 mount sits beside cgroup v1 controllers (crun's refusal)."""
    from trialbox.sandbox.cgroups import _mounts
    kinds = {fstype for _mp, fstype, _opts in _mounts()}
    return {"cgroup", "cgroup2"} <= kinds


def engine_for(runtime: str) -> Engine:
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown container runtime {runtime!r}; use one of "
                         f"{', '.join(RUNTIMES)}")
    binary = shutil.which(runtime) or RUNTIMES[runtime]
    return Engine(runtime, binary, userns=True, own_views=True, proc_views=procview.NAMES,
                  hide_cgroup2=runtime == "crun" and _hybrid_cgroups())


class ContainerProvider(OciProvider):
    """Sessions of the `container` tier, run by `runc` (default) or `crun`.

        async with ContainerProvider(runtime="crun") as provider:
            async with await provider.open() as sb:
                r = await sb.exec(["/bin/echo", "hi"])
    """

    tier = "container"

    def __init__(self, config: OciConfig | None = None, runtime: str = "runc"):
        super().__init__(engine_for(runtime), config)
