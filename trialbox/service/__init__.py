"""The HTTP service (`trialbox serve`): native `/v1`, SandboxFusion-compatible
`/run_code`, health and readiness, behind auth, size and rate limits, a bounded
admission queue and per-request deadlines. See docs/service.md.

    from trialbox.service import ServiceConfig, create_app
    app = create_app(ServiceConfig(port=8080))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trialbox.service.config import ServiceConfig

if TYPE_CHECKING:
    from trialbox.service.app import create_app

__all__ = ["ServiceConfig", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy: `trialbox --help` imports this package for `serve`'s options and must not
    # pay ~0.5 s for FastAPI.
    if name == "create_app":
        from trialbox.service.app import create_app
        return create_app
    raise AttributeError(name)
