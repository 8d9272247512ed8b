"""`trialbox doctor` and the tier dispatch: what the node can run, and clear errors for
what it cannot (never a silent fallback to a weaker tier)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from trialbox.cli import main
from trialbox.errors import SandboxUnavailable, UsageError
from trialbox.sandbox import TIERS, open_sandbox
from trialbox.sandbox.doctor import check_container, check_gvisor, format_report, NodeReport


def test_doctor_reports_every_tier(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    tiers = {t["tier"]: t for t in report["tiers"]}
    assert set(tiers) == {"namespace", "gvisor", "container (runc)", "container (crun)"}
    for t in tiers.values():  # this node has every runtime (scripts/setup-system.sh)
        assert t["ok"], t
    assert report["gvisor_platforms"]["ptrace"] == "ok"
    assert "not probed" in report["gvisor_platforms"]["kvm"]  # never tried unasked
    assert report["cgroup"].startswith("v1 (") and report["root"] is True


def test_missing_runtime_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import trialbox.sandbox.container as container
    import trialbox.sandbox.gvisor as gvisor
    monkeypatch.setattr(gvisor, "RUNSC", "/nonexistent/runsc")
    monkeypatch.setattr(container, "RUNTIMES", {"runc": "/nonexistent/runc",
                                                "crun": "/nonexistent/crun"})
    monkeypatch.setenv("PATH", "/nonexistent")
    g = asyncio.run(check_gvisor())
    c = asyncio.run(check_container("crun"))
    assert (g.ok, g.fix) == (False, "apt-get install runsc"), g
    assert (c.ok, c.fix) == (False, "apt-get install crun"), c
    text = format_report(NodeReport("k", "c", True, True, [g, c]))
    assert "gvisor             no   runsc (gVisor) is not installed" in text
    assert "fix: apt-get install crun" in text


def test_a_tier_the_node_lacks_is_an_error_not_a_fallback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import trialbox.sandbox.gvisor as gvisor
    real = gvisor.GVisorProvider.__init__

    def broken(self, config=None, platform="ptrace", runsc=gvisor.RUNSC):  # type: ignore
        real(self, config, platform, runsc="/nonexistent/runsc")
    monkeypatch.setattr(gvisor.GVisorProvider, "__init__", broken)

    async def body() -> None:
        await open_sandbox("gvisor")
    with pytest.raises(SandboxUnavailable, match=r"needs runsc .*apt-get install runsc"):
        asyncio.run(body())


def test_unknown_tier() -> None:
    assert TIERS == ("namespace", "gvisor", "container")
    with pytest.raises(UsageError, match="unknown sandbox tier 'vm'.*gvisor"):
        asyncio.run(open_sandbox("vm"))


def test_exec_in_the_gvisor_tier_from_the_cli() -> None:
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "exec", "--json", "--tier",
                        "gvisor", "--", "/bin/uname", "-r"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["status"], out["tier"]) == ("ok", "gvisor"), out
    assert out["stdout"] == "4.4.0\n" != os.uname().release + "\n"  # gVisor's kernel
