"""One Ray cluster shared by the cluster suites that need no head of their own.

Starting Ray costs ~20-35 s on two cores (more under load). test_fleet.py,
test_remote_sessions.py and test_serve_cluster.py each want the same head: one trialbox
node offering the namespace tier; nodes they kill or add are their own, added on top of
it and removed before the next test. They share `namespace_head`, started for the first
of them and shut down after the last, each module connecting to it as its driver
(`cluster`). Suites whose head has another shape (test_ray_cluster.py: two fake-tier
nodes; test_node_tiers.py: gvisor only) or that need a network of their own
(test_netns_nodes.py) start their own cluster, and run first (the collection order below):
no two Ray clusters run at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared cluster move after the other cluster suites' (a stable
    sort of this directory's items in their own places: every module keeps its order)."""
    at = [i for i, item in enumerate(items) if item.path.parent == HERE]
    ordered = sorted((items[i] for i in at),
                     key=lambda item: "namespace_head" in getattr(item, "fixturenames", ()))
    for i, item in zip(at, ordered, strict=True):
        items[i] = item


@pytest.fixture(scope="package")
def namespace_head() -> Iterator[Any]:
    """A cluster whose head (one CPU) is a trialbox node offering the namespace tier."""
    pytest.importorskip("ray")
    from tests.cluster.test_ray_cluster import head_cluster
    c = head_cluster("namespace")
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def cluster(namespace_head: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The shared cluster, this module's process its driver."""
    from tests.cluster.test_ray_cluster import connected
    with connected(namespace_head, tmp_path_factory):
        yield namespace_head
