"""The service's one config object (STYLE.md 8): every knob of `trialbox serve`.

    config = ServiceConfig(port=8080)                     # loopback, no token needed
    config = ServiceConfig(host="0.0.0.0", token="s3cret")  # elsewhere: a token is required
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field, fields

from trialbox.errors import UsageError
from trialbox.types import Limits

TIERS = ("namespace", "gvisor", "container")
"""The tiers `trialbox serve --tier` can serve from."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`; anything else is reachable by others."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServiceConfig:
    """How one `trialbox serve` process listens, admits and limits requests."""

    host: str = "127.0.0.1"
    """Address to bind. Loopback by default; any other address requires `token`."""
    port: int = 8080
    """TCP port to bind (0: any free port)."""
    token: str | None = None
    """Bearer token every request must carry (`Authorization: Bearer <token>`), except
    `/healthz` and `/readyz`. Required when `host` is not loopback."""
    max_body_bytes: int = 16 << 20
    """Largest request body accepted; larger ones get 413 before they are read whole."""
    rate_per_s: float = 200.0
    """Per-client token bucket: sustained requests per second (client = token or IP)."""
    rate_burst: int = 400
    """Per-client token bucket: how many requests may arrive at once."""
    max_running: int = 8
    """Sandbox-using requests executing at once: the scheduler's slots (one sandbox
    provider per process)."""
    max_queued: int = 64
    """Sandbox-using requests waiting for a slot; more are refused with 503."""
    queue_wait_s: float = 30.0
    """How long a request may wait for a slot before it is refused with 503."""
    deadline_s: float = 120.0
    """Default per-request deadline (a client may ask for less with `X-Deadline-S`);
    past it the run is stopped and the answer is 504."""
    max_sessions: int = 256
    """Open `/v1/sessions` at once; more are refused with 503."""
    max_sessions_per_client: int | None = None
    """Open `/v1/sessions` one client may hold (client: its address, an IPv6 one by its
    /64); more are refused with 429. None: half of `max_sessions` (at least 1)."""
    read_timeout_s: float = 15.0
    """Seconds a client may take to send a request's headers, and between two pieces of
    its body: past it the connection is closed (headers) or answered 408 (body)."""
    allowed_hosts: tuple[str, ...] = ()
    """Names besides the bound address, `localhost`, 127.0.0.1 and ::1 that a request's
    `Host` (and a state-changing request's `Origin`) may name when no token is set — a
    reverse proxy's name. Without a token, any other name is refused (403): a web page
    that rebinds its own name to 127.0.0.1 cannot use the server."""
    session_idle_s: float = 600.0
    """A session unused this long is closed by the server."""
    warm: int = 4
    """Sandbox cells kept warm in the pool."""
    default_limits: Limits = field(default_factory=lambda: Limits(wall_s=10, cpu_s=10,
                                                                 memory_mb=512))
    """Limits of a run when the request names none."""
    max_limits: Limits = field(default_factory=lambda: Limits(
        wall_s=300, cpu_s=300, memory_mb=4096, disk_mb=1024, pids=512))
    """The most a request may ask for; asking for more is a 422 naming the field."""
    keep_submissions: int = 10_000
    """Graded submissions remembered for `/v1/submissions/{id}` (oldest forgotten)."""
    tier: str = "namespace"
    """The isolation tier every sandbox comes from: `namespace` (the warm CellPool,
    default), `gvisor` or `container` (sandbox/tiers.py). Grading needs `namespace`."""
    journal: str | None = None
    """The scheduler's journal (SQLite) every sandbox-using request is a task in (run
    `service-<start>-<pid>`; `trialbox tasks status RUN --db FILE`). None: a temporary
    file, deleted at shutdown."""
    records: str | None = None
    """A SQLite file (the scheduler's journal format) where graded submissions are kept,
    so they survive a restart; None: in memory only."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and (
                    isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise UsageError(f"ServiceConfig.{f.name} must be a number, got {value!r}")
        if not 0 <= self.port <= 65535:
            raise UsageError(f"ServiceConfig.port={self.port} is not a TCP port (0-65535)")
        positive = ("max_body_bytes", "rate_per_s", "rate_burst", "max_running",
                    "queue_wait_s", "deadline_s", "max_sessions", "session_idle_s",
                    "keep_submissions", "read_timeout_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UsageError(f"ServiceConfig.{name} must be > 0, got "
                                 f"{getattr(self, name)!r}")
        if self.max_queued < 0 or self.warm < 0:
            raise UsageError("ServiceConfig.max_queued and warm must be >= 0")
        per = self.max_sessions_per_client
        if per is not None and (isinstance(per, bool) or not isinstance(per, int)
                                or not 1 <= per <= self.max_sessions):
            raise UsageError(f"ServiceConfig.max_sessions_per_client={per!r} must be a "
                             f"whole number from 1 to max_sessions ({self.max_sessions}), "
                             "or None (half of max_sessions)")
        for name in self.allowed_hosts:
            if not isinstance(name, str) or not name or any(c in name for c in "/ ,"):
                raise UsageError(f"ServiceConfig.allowed_hosts: {name!r} is not a host "
                                 "name; give bare names such as 'trialbox.internal'")
        if self.tier not in TIERS:
            raise UsageError(f"ServiceConfig.tier={self.tier!r}: use one of "
                             f"{', '.join(TIERS)}")
        if self.token is not None and not self.token.strip():
            raise UsageError("ServiceConfig.token is empty; give a real token or None")
        if not is_loopback(self.host) and not self.token:
            raise UsageError(
                f"refusing to serve on {self.host!r} without a token: anyone who can reach "
                "it could run code here. Pass --token (or TRIALBOX_TOKEN), or bind "
                "127.0.0.1")

    @property
    def sessions_per_client(self) -> int:
        """The per-client session cap in force (`max_sessions_per_client` or its default)."""
        if self.max_sessions_per_client is not None:
            return self.max_sessions_per_client
        return max(1, self.max_sessions // 2)

    @property
    def host_names(self) -> frozenset[str]:
        """The names a request's `Host` may give (lower case, IPv6 without brackets)
        when no token is set."""
        return frozenset(host_name(n) for n in (self.host, "localhost", "127.0.0.1", "::1",
                                                *self.allowed_hosts))


def host_name(value: str) -> str:
    """The name in a `Host` value or an address, as compared: lower case, without the
    port, an IPv6 address without brackets, no trailing dot.

    >>> host_name("LocalHost:8080"), host_name("[::1]:80"), host_name("::1")
    ('localhost', '::1', '::1')
    """
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")
