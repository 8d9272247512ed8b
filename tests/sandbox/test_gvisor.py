"""The `gvisor` tier (runsc, ptrace platform) on the real runtime: the OCI tiers' shared
cases (oci_cases.py) plus what is gVisor's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sandbox.oci_cases import *  # noqa: F403 - the shared cases run here
from tests.sandbox.oci_cases import OciHarness
from trialbox.errors import SandboxUnavailable
from trialbox.sandbox.gvisor import GVisorProvider, probe_platform
from trialbox.sandbox.oci import OciConfig


@pytest.fixture(scope="module")
def oci() -> Iterator[OciHarness]:
    h = OciHarness(GVisorProvider(OciConfig(warm=2)))
    yield h
    h.close()


def test_runs_under_gvisor(oci: OciHarness) -> None:
    """The candidate's kernel is gVisor's (it reports Linux 4.4.0), not the host's."""
    import platform
    r = oci.one("uname -r", "bash")
    assert r.stdout == b"4.4.0\n" != platform.release().encode() + b"\n", r.stdout


def test_missing_runsc_is_a_clear_error(oci: OciHarness) -> None:
    p = GVisorProvider(OciConfig(warm=0), runsc="/nonexistent/runsc")
    with pytest.raises(SandboxUnavailable, match="apt-get install runsc"):
        oci.run(p.start())


def test_unproven_platform_is_refused() -> None:
    assert probe_platform("ptrace") == ""
    assert "unknown platform" in probe_platform("qemu")
