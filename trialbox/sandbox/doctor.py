"""`trialbox doctor`: which isolation tiers this node can run, and why not the others.

Each tier is checked the only way that proves it works: a real sandbox is started and
runs `/bin/true` (with a timeout). Around that: kernel, cgroup version and controllers,
seccomp, and for what is missing the command that installs it.

    report = await diagnose()
    for t in report.tiers:
        print(t.tier, "yes" if t.ok else f"no: {t.reason} (fix: {t.fix})")
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from trialbox.types import Limits

PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TierReport:
    """Whether one tier runs on this node."""

    tier: str
    ok: bool
    reason: str = ""
    """Why not, in words (empty when ok)."""
    fix: str = ""
    """The command or change that would make it work (empty when ok or unknown)."""
    detail: str = ""
    """What was found (runtime version, platform, probe time)."""


@dataclass(frozen=True)
class NodeReport:
    """The node: kernel, cgroups, seccomp, root, and every tier's verdict."""

    kernel: str
    cgroup: str
    seccomp: bool
    root: bool
    tiers: list[TierReport] = field(default_factory=list)
    gvisor_platforms: dict[str, str] = field(default_factory=dict)
    """Platform -> "ok" or why it does not boot (kvm only probed when asked)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def available(self) -> list[str]:
        return [t.tier for t in self.tiers if t.ok]


def _cgroup_summary() -> str:
    from trialbox.sandbox.cgroups import _mounts
    v1 = sorted({c for _mp, fs, opts in _mounts() if fs == "cgroup"
                 for c in ("memory", "pids", "cpu", "cpuacct") if c in opts})
    v2 = []
    for mp, fs, _opts in _mounts():
        if fs == "cgroup2":
            try:
                with open(os.path.join(mp, "cgroup.controllers")) as f:
                    v2.append(f"{mp} [{f.read().strip() or 'no controllers'}]")
            except OSError:
                v2.append(f"{mp} [unreadable]")
    parts = []
    if v1:
        parts.append(f"v1 ({', '.join(v1)})")
    if v2:
        parts.append(f"v2 at {', '.join(v2)}")
    return "; ".join(parts) or "none mounted"


def _seccomp() -> bool:
    try:
        with open("/proc/self/status") as f:
            return any(line.startswith("Seccomp:") for line in f)
    except OSError:
        return False


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return ""
    return (out.stdout or out.stderr).splitlines()[0].strip() if (out.stdout or out.stderr) \
        else ""


async def _probe(provider: Any) -> str:
    """'' when the provider starts and a session runs /bin/true, else why not."""
    from trialbox.errors import TrialboxError
    try:
        await asyncio.wait_for(provider.start(), PROBE_TIMEOUT_S)
        sb = await asyncio.wait_for(provider.open(Limits(wall_s=10)), PROBE_TIMEOUT_S)
        try:
            r = await sb.exec(["/bin/true"])
        finally:
            await sb.close()
        return "" if r.ok else f"a probe run ended {r.status.value}: {r.message}"
    except (TrialboxError, OSError, TimeoutError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        await provider.close()


async def check_namespace() -> TierReport:
    from trialbox.sandbox.pool import CellPool, PoolConfig
    t = time.monotonic()
    pool = CellPool(PoolConfig(warm=0))
    from trialbox.errors import TrialboxError
    try:
        await pool.start()
        from trialbox.sandbox.namespace import NamespaceSandbox
        async with await NamespaceSandbox.open(pool, Limits(wall_s=10)) as sb:
            r = await sb.exec(["/bin/true"])
        why = "" if r.ok else f"a probe run ended {r.status.value}: {r.message}"
    except (TrialboxError, OSError) as e:
        why = f"{type(e).__name__}: {e}"
    finally:
        await pool.close()
    if why:
        return TierReport("namespace", False, why, "run as root on Linux with cgroup "
                          "memory, pids, cpu controllers (v1, or v2 with them enabled) "
                          "and overlayfs (modprobe overlay)")
    return TierReport("namespace", True, detail=f"probe {time.monotonic() - t:.2f} s")


async def check_gvisor() -> TierReport:
    from trialbox.sandbox.gvisor import RUNSC, GVisorProvider
    from trialbox.sandbox.oci import OciConfig
    if not os.access(RUNSC, os.X_OK) and not shutil.which("runsc"):
        return TierReport("gvisor", False, "runsc (gVisor) is not installed",
                          "apt-get install runsc")
    t = time.monotonic()
    why = await _probe(GVisorProvider(OciConfig(warm=0)))
    version = _version([RUNSC, "--version"])
    if why:
        return TierReport("gvisor", False, why, "see docs/tiers.md (gvisor)", version)
    return TierReport("gvisor", True, detail=f"{version}, platform ptrace, probe "
                                             f"{time.monotonic() - t:.2f} s")


async def check_container(runtime: str) -> TierReport:
    from trialbox.sandbox.container import RUNTIMES, ContainerProvider
    from trialbox.sandbox.oci import OciConfig
    name = f"container ({runtime})"
    if not os.access(RUNTIMES[runtime], os.X_OK) and not shutil.which(runtime):
        return TierReport(name, False, f"{runtime} is not installed",
                          f"apt-get install {runtime}")
    t = time.monotonic()
    why = await _probe(ContainerProvider(OciConfig(warm=0), runtime=runtime))
    version = _version([RUNTIMES[runtime], "--version"])
    if why:
        return TierReport(name, False, why, "see docs/tiers.md (container)", version)
    return TierReport(name, True, detail=f"{version}, probe {time.monotonic() - t:.2f} s")


async def diagnose(probe_kvm: bool = False) -> NodeReport:
    """Check every tier on this node (each by a real probe run, one after another)."""
    from trialbox.sandbox.gvisor import probe_platform
    root = os.geteuid() == 0
    tiers = [await check_namespace(), await check_gvisor(),
             await check_container("runc"), await check_container("crun")]
    platforms = {"ptrace": "ok" if tiers[1].ok else tiers[1].reason}
    if probe_kvm:
        why = await asyncio.get_running_loop().run_in_executor(None, probe_platform, "kvm")
        platforms["kvm"] = why or "ok"
    else:
        platforms["kvm"] = "not probed (trialbox doctor --probe-kvm; it hangs on some hosts)"
    return NodeReport(kernel=f"{platform.system()} {platform.release()}",
                      cgroup=_cgroup_summary(), seccomp=_seccomp(), root=root,
                      tiers=tiers, gvisor_platforms=platforms)


def format_report(r: NodeReport) -> str:
    lines = [f"kernel   {r.kernel}", f"cgroups  {r.cgroup}",
             f"seccomp  {'yes' if r.seccomp else 'no'}", f"root     {'yes' if r.root else 'no'}",
             "tiers:"]
    for t in r.tiers:
        if t.ok:
            lines.append(f"  {t.tier:<18} yes  {t.detail}")
        else:
            lines.append(f"  {t.tier:<18} no   {t.reason}")
            if t.fix:
                lines.append(f"  {'':<18}      fix: {t.fix}")
    lines.append("gvisor platforms: " + "; ".join(f"{k}: {v}"
                                                  for k, v in r.gvisor_platforms.items()))
    return "\n".join(lines)


async def measure(tier: str, runs: int = 30, gap_s: float = 0.06) -> dict[str, float]:
    """Cold start and warm-session run latency of one tier, in ms: `cold_open` (a
    session with no warm one waiting: container start + fork server ready), `first_run`
    on it, then `runs` runs of /bin/true and of `python3 -c pass` in one warm session,
    `gap_s` apart (the think time between turns; the next run's child is forked in it),
    and back to back (gap 0)."""
    from trialbox.sandbox.container import ContainerProvider
    from trialbox.sandbox.gvisor import GVisorProvider
    from trialbox.sandbox.oci import OciConfig, OciProvider
    provider: OciProvider = (GVisorProvider(OciConfig(warm=0)) if tier == "gvisor" else
                             ContainerProvider(OciConfig(warm=0), runtime=tier.split(":")[-1]))
    await provider.start()
    out: dict[str, float] = {}
    try:
        colds = []
        for _ in range(3):
            t = time.perf_counter()
            sb = await provider.open(Limits(wall_s=10))
            colds.append((time.perf_counter() - t) * 1e3)
            await sb.close()
        out["cold_open_p50"] = sorted(colds)[1]
        async with await provider.open(Limits(wall_s=10)) as sb:
            for name, argv, gap in (("true", ["/bin/true"], gap_s),
                                    ("python", ["python3", "-c", "pass"], gap_s),
                                    ("true_back_to_back", ["/bin/true"], 0.0)):
                walls = []
                for _ in range(runs):
                    await asyncio.sleep(gap)
                    t = time.perf_counter()
                    r = await sb.exec(argv)
                    walls.append((time.perf_counter() - t) * 1e3)
                    if not r.ok:
                        raise RuntimeError(f"{tier} {name}: {r.status.value} {r.message}")
                walls.sort()
                out[f"{name}_p50"] = walls[len(walls) // 2]
                out[f"{name}_p95"] = walls[min(len(walls) - 1, int(len(walls) * 0.95))]
    finally:
        await provider.close()
    return {k: round(v, 1) for k, v in out.items()}
