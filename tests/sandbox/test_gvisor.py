"""The `gvisor` tier (runsc, ptrace platform) on the real runtime: the OCI tiers' shared
cases (oci_cases.py) plus what is gVisor's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sandbox.oci_cases import *  # noqa: F403 - the shared cases run here
from tests.sandbox.conftest import FAST
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


def test_large_stdin_and_passed_fds_arrive_whole(oci: OciHarness) -> None:
    """A run's spec and stdin reach the fork server and the waiting child in 64 KiB reads
    (forkserver.RECV_SIZE); a stdin many reads long arrives whole, in order, with the
    passed fd beside it."""
    import hashlib
    import socket

    data = bytes(range(256)) * 4000 + b"end"  # ~1 MiB: 16 reads of each hop
    code = ("import hashlib, os, sys\nd = sys.stdin.buffer.read()\n"
            "os.write(3, hashlib.sha256(d).hexdigest().encode())\nprint(len(d))")

    async def body() -> tuple[bytes, bytes]:
        ours, theirs = socket.socketpair()
        try:
            async with await oci.provider.open(FAST.with_(wall_s=20)) as sb:
                r = await sb.exec(["python3", "-c", code], stdin=data,
                                  pass_fds={3: theirs.detach()})
            return r.stdout, ours.recv(100)
        finally:
            ours.close()

    out, digest = oci.run(body())
    assert out == b"%d\n" % len(data), out
    assert digest == hashlib.sha256(data).hexdigest().encode()


def test_judging_provider_preloads_the_candidate_side_only() -> None:
    """The judge's gvisor provider preloads the codec and the stub into its fork servers,
    not the trusted harness (it runs on the namespace tier): every page of a fork
    server's heap costs each run a copy under gVisor (docs/tiers.md)."""
    from trialbox.judge.provider import make_provider
    p = make_provider("gvisor")
    names = {name for name, _source in p.candidate.config.preload_sources}
    assert names == {"_trialbox_codec", "_trialbox_stub"}
    assert p.preloaded_modules == names
