"""The `container` tier on real runtimes, runc and crun: the OCI tiers' shared cases
(oci_cases.py) for each."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.sandbox.oci_cases import *  # noqa: F403 - the shared cases run here
from tests.sandbox.oci_cases import OciHarness
from trialbox.errors import UsageError
from trialbox.sandbox.container import ContainerProvider, engine_for
from trialbox.sandbox.oci import OciConfig


@pytest.fixture(scope="module", params=["runc", "crun"])
def oci(request: pytest.FixtureRequest) -> Iterator[OciHarness]:
    h = OciHarness(ContainerProvider(OciConfig(warm=1), runtime=request.param))
    yield h
    h.close()


def test_unknown_runtime_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="runc, crun"):
        engine_for("docker")


def test_a_node_refusing_unprivileged_user_namespaces_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each container session's user namespace is owned by an unprivileged uid of its own
    (userns.py); where the node refuses one, the tier does not start (never a container
    owned by host root) and the error says what to allow."""
    import asyncio

    from trialbox.errors import SandboxStartError, SandboxUnavailable
    from trialbox.sandbox import oci

    def refused(*_args: object, **_kw: object) -> tuple[int, int]:
        raise SandboxStartError("unshare: unshare failed: Operation not permitted")

    monkeypatch.setattr(oci, "make_userns", refused)
    p = ContainerProvider(OciConfig(warm=0))
    with pytest.raises(SandboxUnavailable, match="unprivileged_userns_clone"):
        asyncio.run(p.start())
    assert not os.path.exists(p.dir)  # refused before it made anything
