"""The `gvisor` tier: sessions in gVisor's user-space kernel (`runsc`, ptrace platform).

The candidate's system calls are served by gVisor's Sentry, not the host kernel: a
kernel bug reachable from the sandbox is a bug in the Sentry, which itself runs as an
unprivileged, seccomp-confined host process. The session machinery (bundle, fork
server, limits, statuses) is oci.py's; this module picks `runsc` and its flags.

Platform: `ptrace` by default. Another platform (`kvm`) is used only when a probe proves
it boots within a timeout (`probe_platform`): on this machine kvm hangs.

Process limits: this runsc version breaks when its host cgroup has a tight pids limit
(its Sentry and ptrace stubs are host threads), so runsc runs with --ignore-cgroups
inside a cgroup of ours with a generous pids backstop, and a run's process count is
enforced inside the sandbox by RLIMIT_NPROC=Limits.pids (gVisor enforces it: fork
fails with EAGAIN), set by the fork server for the run's uid.

A session is a sandbox of its own: a closed session's sandbox is destroyed, and the next
`open()` gets a fresh one started ahead (`OciConfig.warm`) — one gVisor kernel serving
consecutive sessions would carry its clocks, TCP/IP statistics and pid counter from one
to the next. `OciConfig(recycle=True)` reuses them where sessions are one trust domain.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from trialbox.errors import SandboxUnavailable
from trialbox.sandbox.oci import Engine, OciConfig, OciProvider
from trialbox.types import Limits

RUNSC = "/usr/bin/runsc"
PLATFORMS = ("ptrace", "kvm")
PIDS_BACKSTOP = 4096
"""Host threads the whole gVisor sandbox (Sentry, gofer, stubs) may have: a backstop,
far above what RLIMIT_NPROC lets a run create."""
SENTRY_SLACK_MB = 96
"""Host memory the Sentry may use above a run's Limits.memory_mb before the host's OOM
killer ends the sandbox (the run's own use is polled from outside and stopped at the
limit first; this catches allocations faster than the poll)."""


def probe_platform(platform: str, timeout_s: float = 5.0, runsc: str = RUNSC) -> str:
    """'' when `runsc --platform=<platform>` boots a sandbox that runs /bin/true within
    `timeout_s`, else why not. Everything the probe started is killed and deleted."""
    if platform not in PLATFORMS:
        return f"unknown platform {platform!r} (known: {', '.join(PLATFORMS)})"
    if platform == "kvm" and not os.path.exists("/dev/kvm"):
        return "no /dev/kvm"
    root = tempfile.mkdtemp(prefix="trialbox-probe-")
    cmd = [runsc, "--root", root, f"--platform={platform}", "--network=none",
           "--ignore-cgroups"]
    try:
        p = subprocess.Popen([*cmd, "do", "/bin/true"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True, cwd="/")
        try:
            _, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            return f"did not boot within {timeout_s:g} s (hangs)"
        if p.returncode != 0:
            return f"exit status {p.returncode}: {err.decode(errors='replace')[-300:]}"
        return ""
    except OSError as e:
        return str(e)
    finally:
        listed = subprocess.run([*cmd, "list", "--quiet"], capture_output=True, text=True,
                                check=False, timeout=30)
        for cid in listed.stdout.split():
            subprocess.run([*cmd, "delete", "--force", cid], capture_output=True,
                           check=False, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


class GVisorProvider(OciProvider):
    """Sessions of the `gvisor` tier.

        async with GVisorProvider() as provider:
            async with await provider.open(Limits(wall_s=2)) as sb:
                r = await sb.exec(["python3", "-c", "print(1)"])
    """

    tier = "gvisor"

    def __init__(self, config: OciConfig | None = None, platform: str = "ptrace",
                 runsc: str = RUNSC):
        self.platform = platform
        config = config or OciConfig()
        super().__init__(Engine("runsc", runsc,
                                (f"--platform={platform}", "--network=none",
                                 "--ignore-cgroups"),
                                userns=False, join_cgroup=True, ctl_fd=0,
                                proc_views=("meminfo",),
                                recycle=config.recycle),
                         config)

    def check(self) -> None:
        super().check()
        if self.platform not in PLATFORMS:
            raise SandboxUnavailable(f"unknown gVisor platform {self.platform!r}; use one "
                                     f"of {', '.join(PLATFORMS)}")
        if self.platform != "ptrace":  # never trust a platform that has not booted here
            why = probe_platform(self.platform, runsc=self.engine.binary)
            if why:
                raise SandboxUnavailable(f"gVisor platform {self.platform} does not work "
                                         f"on this node: {why}; use platform='ptrace'")

    def host_limits(self, limits: Limits) -> Limits:
        return limits.with_(pids=PIDS_BACKSTOP, memory_mb=limits.memory_mb + SENTRY_SLACK_MB)
