"""Which software this process runs: what a driver compares with its nodes' and its
policy servers' before they start anything (a node or a server with another Python, Ray
or trialbox code is refused, never half-used).

It sits with the vocabulary (`types`, `errors`), below every layer, because both the
cluster backend (`cluster/backend.py`, its nodes) and the rollout layer's policy fleet
(`rollout/fleet.py`, its servers) make the same check, and the rollout layer must not
import the cluster (tests/test_layers.py). Nothing here imports Ray.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

from trialbox.errors import UsageError

PACKAGE = os.path.dirname(os.path.abspath(__file__))
"""The trialbox package directory this process imported."""


class VersionMismatch(UsageError):
    """A node (or a policy server) runs another Python, Ray or trialbox code than the
    driver."""


def _ray_version() -> str | None:
    import importlib.metadata as md
    try:
        return md.version("ray")
    except md.PackageNotFoundError:
        return None


def software_versions() -> dict[str, Any]:
    """Python, Ray and trialbox code of this process: what a driver compares with its own
    (`software_mismatch`) before a node or a policy server starts anything."""
    return {"python": "%d.%d" % sys.version_info[:2], "ray": _ray_version(),
            "code": code_fingerprint(), "package": PACKAGE}


def code_fingerprint(package: str = PACKAGE) -> str:
    """SHA-256 over the trialbox package's Python (and C) sources: driver and nodes must
    run the same code (a version string can stay equal while the code differs)."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".c")):
                path = os.path.join(root, name)
                h.update(os.path.relpath(path, package).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]


def software_mismatch(info: dict[str, Any], fingerprint: str) -> str:
    """What differs between another process's `software_versions()` and this one's (""
    when nothing does), said so that the fix is plain."""
    mine = {"python": "%d.%d" % sys.version_info[:2], "ray": _ray_version(),
            "code": fingerprint}
    differ = [f"{k} {info.get(k)} (driver: {v})" for k, v in mine.items()
              if info.get(k) != v]
    if not differ:
        return ""
    return ("runs other software than the driver: " + ", ".join(differ)
            + f"; trialbox there is at {info.get('package')}. Install the same "
            "trialbox, Ray and Python on every node and the driver")
