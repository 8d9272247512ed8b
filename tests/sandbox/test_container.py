"""The `container` tier on real runtimes, runc and crun: the OCI tiers' shared cases
(oci_cases.py) for each."""

from __future__ import annotations

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
