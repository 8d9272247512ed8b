"""What one server process shares between requests: `ServiceState`, on `app.state.service`.

Everything here lives on the event loop of the server; nothing is thread-safe or needs
to be. Readers (the dashboard, /metrics) only read attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.service.admission import Admission
from trialbox.service.config import ServiceConfig
from trialbox.types import Limits


@dataclass
class Counters:
    """Monotonic counts since the process started (read them; only the service writes)."""

    requests: int = 0
    """HTTP requests received (every path)."""
    responses: Counter[int] = field(default_factory=Counter)
    """HTTP responses by status code."""
    runs: Counter[str] = field(default_factory=Counter)
    """Sandbox runs by `ExecStatus` value (`ok`, `timeout`, `memory`, `infra`…)."""
    grades: Counter[str] = field(default_factory=Counter)
    """Graded submissions by `Outcome` value (`passed`, `failed`, `infra`…)."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Requests refused before any work, by reason: `host`, `origin`, `auth`, `size`,
    `rate`, `slow`, `overload`, `sessions`, `client_sessions`."""
    deadline_expired: int = 0
    """Requests answered 504 because their deadline passed (their runs were stopped)."""
    sessions_opened: int = 0
    sessions_closed: int = 0
    sessions_lost: int = 0
    """Sessions whose cluster node was lost (--backend ray): their files went with it."""
    replaced: int = 0
    """One-shot runs and gradings placed again because their cluster node was lost."""


@dataclass
class Session:
    """One `/v1/sessions` session: a sandbox whose files persist across runs."""

    id: str
    sandbox: Sandbox
    limits: Limits
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Runs, uploads and downloads of one session are sequential."""
    runs: int = 0
    owner: str = ""
    """The client that opened it (guard.client_key): what the per-client cap counts."""
    lost: str = ""
    """Set when the cluster node holding the sandbox was lost (--backend ray): every
    later call answers this (503 `infra`); only closing it is left."""
    expires: float | None = None
    """A `time.monotonic()` instant past which the reaper closes it, used or not (an
    E2B sandbox's timeout, e2b.py); when set, `session_idle_s` does not apply."""


class Sessions:
    """The open sessions of this server, closed when idle too long or at shutdown."""

    def __init__(self, limit: int, idle_s: float, per_client: int | None = None):
        self.limit, self.idle_s = limit, idle_s
        self.per_client = per_client if per_client is not None else limit
        """Sessions one client may hold, those being opened included."""
        self._by_id: dict[str, Session] = {}
        self._opening: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, sid: object) -> bool:
        """Whether session `sid` is open (without counting as a use of it)."""
        return sid in self._by_id

    def add(self, sandbox: Sandbox, limits: Limits, owner: str = "") -> Session:
        session = Session(id="s-" + secrets.token_hex(8), sandbox=sandbox, limits=limits,
                          owner=owner)
        self._by_id[session.id] = session
        return session

    def full(self) -> bool:
        return len(self._by_id) + sum(self._opening.values()) >= self.limit

    def held(self, owner: str) -> int:
        """Sessions `owner` holds or is opening."""
        return (sum(1 for s in self._by_id.values() if s.owner == owner)
                + self._opening[owner])

    @contextlib.contextmanager
    def opening(self, owner: str) -> Iterator[None]:
        """Count a session being opened against the caps until it is added (or not)."""
        self._opening[owner] += 1
        try:
            yield
        finally:
            self._opening[owner] -= 1
            if not self._opening[owner]:
                del self._opening[owner]

    def get(self, sid: str) -> Session:
        session = self._by_id.get(sid)
        if session is None:
            raise UsageError(f"no open session {sid!r} (closed, expired after "
                             f"{self.idle_s:g} s idle, or never opened); open one with "
                             "POST /v1/sessions")
        session.last_used = time.monotonic()
        return session

    def pop(self, sid: str) -> Session | None:
        return self._by_id.pop(sid, None)

    def idle(self) -> list[Session]:
        """Sessions unused for longer than `idle_s`, or past their `expires`, and not
        busy, removed from the set."""
        now = time.monotonic()
        old = [s for s in self._by_id.values() if not s.lock.locked() and (
            s.expires < now if s.expires is not None else s.last_used < now - self.idle_s)]
        for s in old:
            del self._by_id[s.id]
        return old

    def drain(self) -> list[Session]:
        out = list(self._by_id.values())
        self._by_id.clear()
        return out


class SubmissionLog(Protocol):
    """Where `/v1/submissions` keeps and finds graded rows: the seam to the scheduler.

    Today `Submissions` (below, in memory) implements it: the service grades directly
    through the judge and remembers the rows. When the scheduler's journal serves task
    status, an adapter over the journal implements these four methods and is passed in
    `ServiceState.submissions`; the routes do not change."""

    def new_id(self) -> str: ...

    def put(self, sid: str, row: dict[str, Any]) -> None: ...

    def get(self, sid: str) -> dict[str, Any]:
        """The row; `UsageError` naming the id when there is none."""
        ...

    def recent(self, n: int = 50) -> list[dict[str, Any]]: ...

    def __len__(self) -> int: ...


class Submissions:
    """Graded submissions this server handled, by id, newest kept (a bounded log in
    memory, lost on restart): the `SubmissionLog` used today."""

    def __init__(self, keep: int):
        self.keep = keep
        self._seq = itertools.count(1)
        self._rows: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def new_id(self) -> str:
        return f"sub-{next(self._seq)}-{secrets.token_hex(4)}"

    def put(self, sid: str, row: dict[str, Any]) -> None:
        self._rows[sid] = row
        self._rows.move_to_end(sid)
        while len(self._rows) > self.keep:
            self._rows.popitem(last=False)

    def get(self, sid: str) -> dict[str, Any]:
        row = self._rows.get(sid)
        if row is None:
            raise UsageError(f"no submission {sid!r} (unknown, or older than the last "
                             f"{self.keep} this server keeps)")
        return row

    def recent(self, n: int = 50) -> list[dict[str, Any]]:
        return list(reversed(list(self._rows.values())[-n:]))

    def __len__(self) -> int:
        return len(self._rows)


@dataclass
class ServiceState:
    """Shared objects of one server process (`app.state.service`).

    config       the `ServiceConfig` it was started with
    provider     the process's one `SandboxProvider` (the namespace tier's `CellPool`
                 unless `create_app` was given another — with --backend ray the
                 cluster's `ServingProvider`, whose sessions live on the nodes; None
                 before startup / after shutdown)
    admission    the journaled scheduler in front of the sandboxes (`running`,
                 `waiting` give the live queue depth; admission.py)
    sessions     open `/v1/sessions` sessions (`len()` is how many)
    submissions  graded submissions this server handled (`recent()` for a list)
    counters     monotonic counts: requests, responses by code, runs by status, grades
                 by outcome, refusals by reason, deadline expiries
    started      wall-clock start time (time.time())
    """

    config: ServiceConfig
    admission: Admission
    sessions: Sessions
    submissions: SubmissionLog
    counters: Counters = field(default_factory=Counters)
    provider: SandboxProvider | None = None
    started: float = field(default_factory=time.time)
    ready: bool = False
    """True once the provider and scheduler are started and until shutdown begins
    (`/readyz`)."""
    open_paths: list[str] = field(default_factory=list)
    """Path prefixes served without the bearer token (besides /healthz, /readyz)."""
    own_auth_paths: list[str] = field(default_factory=list)
    """Paths (exact; a prefix when it ends in `/`) whose routes check a credential of
    their own instead of the bearer token: the E2B envd API, where each sandbox has its
    access token (e2b_envd.py). Every other Guard check still applies."""
    grader: Any = None
    """Where submissions are graded when not on `provider`: `--backend ray`'s
    `cluster.serving.ClusterGrader` (`grade(task, answer, language)`, `status()`)."""

    @classmethod
    def create(cls, config: ServiceConfig) -> ServiceState:
        """The state of a new server; `config.records` picks the durable submission log."""
        return cls(config=config,
                   admission=Admission(config.max_running, config.max_queued,
                                       config.queue_wait_s, config.max_limits,
                                       config.journal),
                   sessions=Sessions(config.max_sessions, config.session_idle_s,
                                     config.sessions_per_client),
                   submissions=_submission_log(config))

    @property
    def pool(self) -> SandboxProvider | None:
        """The provider, under the name the telemetry half reads (`ready_count` when the
        provider is a warm pool; a cluster's `ServingProvider` has none: its cells are
        on the nodes)."""
        return self.provider

    def require_provider(self) -> SandboxProvider:
        from trialbox.errors import SandboxUnavailable
        if self.provider is None or not self.ready:
            raise SandboxUnavailable("the sandbox provider is not running (server "
                                     "starting or shutting down); retry shortly")
        return self.provider


def _submission_log(config: ServiceConfig) -> SubmissionLog:
    if config.records is None:
        return Submissions(config.keep_submissions)
    from trialbox.store.submissions import JournalSubmissions
    return JournalSubmissions(config.records, keep=config.keep_submissions)
