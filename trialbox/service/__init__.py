"""The HTTP service (`trialbox serve`): native `/v1`, SandboxFusion-compatible
`/run_code`, health and readiness, behind auth, size and rate limits, a bounded
admission queue and per-request deadlines. See docs/service.md.

    from trialbox.service import ServiceConfig, create_app
    app = create_app(ServiceConfig(port=8080))
"""

from trialbox.service.app import create_app
from trialbox.service.config import ServiceConfig

__all__ = ["ServiceConfig", "create_app"]
