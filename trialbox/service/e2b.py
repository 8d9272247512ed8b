"""An E2B-compatible control API: the unmodified `e2b` SDK creates and manages sandboxes
here (docs/service.md, "E2B-compatible API"; the envd half is e2b_envd.py).

    E2B_API_URL=http://127.0.0.1:8080 E2B_SANDBOX_URL=http://127.0.0.1:8080 \\
    E2B_API_KEY=<the server's token, or anything without one> python -c '
    from e2b import Sandbox
    with Sandbox.create() as sb: print(sb.commands.run("echo hi").stdout)'

    POST   /sandboxes, /v2/sandboxes          create {templateID, timeout?, envVars?, metadata?}
    GET    /sandboxes, /v2/sandboxes          this client's sandboxes
    GET    /sandboxes/{id}                    one of them
    DELETE /sandboxes/{id}                    kill it
    POST   /sandboxes/{id}/timeout            {timeout}: it is killed that many s from now
    POST   /sandboxes/{id}/refreshes          {duration}: the same, never shortening
    POST   /sandboxes/{id}/pause              parked: files kept, compute freed
    POST   /sandboxes/{id}/resume, /sandboxes/{id}/connect, /v2/sandboxes/{id}/connect
    POST   /sandboxes/{id}/fork               {count, timeout}: copy-on-write children
    POST   /sandboxes/{id}/snapshots, GET /snapshots   refused (501): not built yet
    GET    /sandboxes/{id}/metrics, /logs     refused (501)

A sandbox is a `/v1` session (the same `Sessions`, caps, reaper and provider; opened
through `v1.open_session`), owned by the client that created it (`client_of`: its
address, as every per-client rule of the service): another client's sandboxes are
not listed and answer 404. `templateID` names the server's tier (`base`, E2B's default,
is the same). The session gets an `expires` instant (the sandbox's timeout) and the
server's reaper closes it then. Each sandbox has an envd access token, returned here
only, that the envd API (e2b_envd.py) demands with every request.

Errors are E2B's: `{"code": status, "message": ...}` — the SDK parses that shape.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from trialbox.errors import InfraError, TrialboxError, UsageError
from trialbox.service.admission import Overloaded
from trialbox.service.errors import ClientLimit, NotFound
from trialbox.service.models import SessionIn
from trialbox.service.state import ServiceState, Session

ENVD_VERSION = "0.5.7"
"""The envd version announced: new enough that the SDK sends no `username` and no
Basic `Authorization` (0.4.0), may upload as octet-stream (0.5.7); older than the
file metadata (0.6.2) and watch extras we do not serve."""
DEFAULT_TIMEOUT_S = 300
"""A sandbox's lifetime when the request gives none (the SDK's default too)."""
MAX_TIMEOUT_S = 86_400
"""The longest lifetime one may ask for (E2B's Pro limit)."""
MAX_FORKS = 20
"""The most forks one request may ask for (the SDK's limit too)."""
TEMPLATES = ("base",)
"""Template names served besides the server's tier name: all mean that tier."""

router = APIRouter(tags=["e2b"])


class E2BError(TrialboxError):
    """Answered as E2B answers errors: `{"code": status, "message": ...}`. Made from one
    of the three kinds of failure (errors.py); the status says which."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass
class E2BSandbox:
    """What E2B says about a sandbox that a `Session` does not hold."""

    sandbox_id: str
    """The session's id."""
    template_id: str
    owner: str
    access_token: str
    """The envd access token: every envd request must carry it (`X-Access-Token`)."""
    started_at: datetime
    end_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    paused: bool = False
    pids: Iterator[int] = field(default_factory=lambda: iter(range(1000, 1 << 31)))
    """Process ids handed to the SDK (not the sandbox's own pids)."""
    running: dict[int, list[str]] = field(default_factory=dict)
    """The command (argv) of each process started and not yet ended, by pid."""
    killed: set[int] = field(default_factory=set)
    """Processes a SendSignal named; one whose run had not begun is never run."""
    active: int | None = None
    """The process whose run is in flight in the session (others wait for its lock)."""

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.access_token.encode())


class E2BSandboxes:
    """The E2B sandboxes of one server (`app.state.e2b`), by id."""

    def __init__(self, state: ServiceState):
        self.state = state
        self._by_id: dict[str, E2BSandbox] = {}
        self.missing = ""
        """Why the envd API is not served (the `e2b` package is not installed), or ""."""

    def add(self, sandbox: E2BSandbox) -> None:
        # forget the sandboxes whose sessions the reaper closed (bounded by the opens)
        for sid in [sid for sid in self._by_id if sid not in self.state.sessions]:
            del self._by_id[sid]
        self._by_id[sandbox.sandbox_id] = sandbox

    def find(self, sid: str, owner: str | None = None) -> tuple[E2BSandbox, Session] | None:
        """The sandbox and its session; None when unknown, closed (killed, reaped at its
        timeout) or, with `owner`, someone else's."""
        box = self._by_id.get(sid)
        if box is None or (owner is not None and box.owner != owner):
            return None
        try:
            session = self.state.sessions.get(sid)
        except UsageError:
            del self._by_id[sid]  # closed by the reaper or at shutdown
            return None
        return box, session

    def of(self, owner: str) -> list[tuple[E2BSandbox, Session]]:
        found = (self.find(sid, owner) for sid in list(self._by_id))
        return [f for f in found if f is not None]

    def remove(self, sid: str) -> None:
        self._by_id.pop(sid, None)


def registry(request: Request) -> E2BSandboxes:
    sandboxes: E2BSandboxes = request.app.state.e2b
    return sandboxes


def _owner(request: Request) -> str:
    from trialbox.service.v1 import client_of
    return client_of(request)


def _found(request: Request, sid: str) -> tuple[E2BSandbox, Session]:
    found = registry(request).find(sid, _owner(request))
    if found is None:
        raise E2BError(404, f"sandbox {sid!r} not found (killed, past its timeout, never "
                       "created, or another client's)")
    return found


@contextlib.contextmanager
def _as_e2b() -> Iterator[None]:
    """The service's own failures, in E2B's error shape (the SDK parses only that)."""
    try:
        yield
    except ClientLimit as e:
        raise E2BError(429, str(e), e.retry_after) from None
    except NotFound as e:
        raise E2BError(404, str(e)) from None
    except UsageError as e:
        raise E2BError(400, str(e)) from None
    except Overloaded as e:
        raise E2BError(503, str(e), e.retry_after) from None
    except InfraError as e:
        raise E2BError(503, f"infrastructure failure (retry): {e}", 1) from None


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _timeout_of(body: dict[str, Any], key: str = "timeout",
                default: int = DEFAULT_TIMEOUT_S) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIMEOUT_S:
        raise E2BError(400, f"{key} must be whole seconds from 0 to {MAX_TIMEOUT_S}, got "
                       f"{value!r}")
    return value


def _set_timeout(box: E2BSandbox, session: Session, seconds: int) -> None:
    session.expires = time.monotonic() + seconds
    box.end_at = datetime.fromtimestamp(time.time() + seconds, UTC)


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json() if await request.body() else {}
    except ValueError:
        raise E2BError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise E2BError(400, "the request body must be a JSON object")
    return body


def _strings(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise E2BError(400, f"{key} must be an object of strings")
    return dict(value)


def _created(box: E2BSandbox) -> dict[str, Any]:
    """E2B's `Sandbox` (create, connect)."""
    return {"templateID": box.template_id, "sandboxID": box.sandbox_id, "clientID": box.owner,
            "envdVersion": ENVD_VERSION, "envdAccessToken": box.access_token,
            "trafficAccessToken": None, "domain": None}


def _listed(box: E2BSandbox, session: Session) -> dict[str, Any]:
    """E2B's `ListedSandbox`; `SandboxDetail` is the same plus the access token."""
    limits = session.limits
    return {"templateID": box.template_id, "sandboxID": box.sandbox_id,
            "clientID": box.owner, "startedAt": _iso(box.started_at),
            "endAt": _iso(box.end_at), "cpuCount": max(1, round(limits.cpus)),
            "memoryMB": limits.memory_mb, "diskSizeMB": limits.disk_mb,
            "state": "paused" if box.paused else "running", "envdVersion": ENVD_VERSION,
            "metadata": box.metadata}


# ----------------------------------------------------------------------- routes

@router.post("/sandboxes", status_code=201)
@router.post("/v2/sandboxes", status_code=201)
async def create(request: Request) -> dict[str, Any]:
    """A new sandbox: a session of this server's tier (`templateID`: that tier's name
    or `base`), killed `timeout` s from now."""
    from trialbox.service.v1 import open_session
    state: ServiceState = request.app.state.service
    if registry(request).missing:
        raise E2BError(501, registry(request).missing)
    body = await _json(request)
    template = body.get("templateID")
    offered = (*TEMPLATES, state.config.tier)
    if template not in offered:
        raise E2BError(404, f"template {template!r} not found: this server offers "
                       f"{', '.join(repr(t) for t in offered)} (all run on its "
                       f"{state.config.tier} tier)")
    timeout = _timeout_of(body)
    metadata, env_vars = _strings(body, "metadata"), _strings(body, "envVars")
    with _as_e2b():
        opened = await open_session(SessionIn(), request)
    sid = opened["session_id"]
    session = state.sessions.get(sid)
    now = datetime.now(UTC)
    box = E2BSandbox(sandbox_id=sid, template_id=str(template), owner=_owner(request),
                     access_token=secrets.token_urlsafe(24), started_at=now, end_at=now,
                     metadata=metadata, env_vars=env_vars)
    _set_timeout(box, session, timeout)
    registry(request).add(box)
    return _created(box)


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
async def list_sandboxes(request: Request, state: str | None = None,
                         metadata: str | None = None) -> list[dict[str, Any]]:
    """This client's sandboxes (one page: no `nextToken`), filtered by `state`
    (running,paused) and `metadata` (k=v&… URL-encoded, as the SDK sends it)."""
    from urllib.parse import parse_qsl
    states = set(state.split(",")) if state else {"running", "paused"}
    wanted = dict(parse_qsl(metadata)) if metadata else {}
    rows = [_listed(box, session) for box, session
            in registry(request).of(_owner(request))]
    return [r for r in rows if r["state"] in states
            and all(r["metadata"].get(k) == v for k, v in wanted.items())]


@router.get("/sandboxes/{sid}")
async def get_sandbox(sid: str, request: Request) -> dict[str, Any]:
    box, session = _found(request, sid)
    return {**_listed(box, session), "envdAccessToken": box.access_token}


@router.delete("/sandboxes/{sid}", status_code=204)
async def kill(sid: str, request: Request) -> Response:
    """Close the session: its processes killed, its files deleted."""
    state: ServiceState = request.app.state.service
    box, session = _found(request, sid)
    registry(request).remove(sid)
    if state.sessions.pop(sid) is not None:
        await session.sandbox.close()
        state.counters.sessions_closed += 1
    return Response(status_code=204)


@router.post("/sandboxes/{sid}/timeout", status_code=204)
async def set_timeout(sid: str, request: Request) -> Response:
    box, session = _found(request, sid)
    _set_timeout(box, session, _timeout_of(await _json(request), default=-1))
    return Response(status_code=204)


@router.post("/sandboxes/{sid}/refreshes", status_code=204)
async def refresh(sid: str, request: Request) -> Response:
    box, session = _found(request, sid)
    seconds = _timeout_of(await _json(request), "duration", DEFAULT_TIMEOUT_S)
    if session.expires is None or session.expires < time.monotonic() + seconds:
        _set_timeout(box, session, seconds)
    return Response(status_code=204)


@router.post("/sandboxes/{sid}/pause", status_code=204)
async def pause(sid: str, request: Request) -> Response:
    """Park the session: its files stay, its compute goes back to the pool. Nothing runs
    in a trialbox session between commands, so no process is lost: a command still
    running is refused (400) rather than killed. The timeout keeps counting."""
    box, session = _found(request, sid)
    if box.paused:
        raise E2BError(409, f"sandbox {sid} is already paused")
    if session.lock.locked() or box.running:
        # not 409: the SDK reads a 409 as "already paused" and returns False
        raise E2BError(400, f"sandbox {sid} is running a command; processes do not survive "
                       "a pause here (no checkpoint/restore): wait for it or kill it first")
    async with session.lock:
        await session.sandbox.park()
    box.paused = True
    return Response(status_code=204)


@router.post("/sandboxes/{sid}/resume", status_code=201)
async def resume(sid: str, request: Request) -> JSONResponse:
    """The older resume: only a paused sandbox (409 otherwise, as E2B answers)."""
    box, _ = _found(request, sid)
    if not box.paused:
        raise E2BError(409, f"sandbox {sid} is not paused")
    return await connect(sid, request)


@router.post("/sandboxes/{sid}/connect", status_code=201)
@router.post("/v2/sandboxes/{sid}/connect", status_code=201)
async def connect(sid: str, request: Request) -> JSONResponse:
    """Resume a paused sandbox (201) or connect to a running one (200); `timeout`, when
    given, is its new lifetime from now."""
    box, session = _found(request, sid)
    body = await _json(request)
    if "timeout" in body:
        _set_timeout(box, session, _timeout_of(body))
    resumed, box.paused = box.paused, False
    return JSONResponse(_created(box), status_code=201 if resumed else 200)


@router.post("/sandboxes/{sid}/fork", status_code=201)
async def fork(sid: str, request: Request) -> list[dict[str, Any]]:
    """`count` (1-20) new sandboxes starting from this one's files, copy-on-write (the
    tier's `Snapshottable.fork`), each with the parent's template, metadata and envs and
    its own `timeout`. No process is copied (none runs between commands); a command
    running now is waited for. Forks past this client's or the server's session cap are
    reported in their place as errors (429 / 503), as E2B reports per-fork failures."""
    from trialbox.sandbox.base import Snapshottable
    state: ServiceState = request.app.state.service
    box, session = _found(request, sid)
    body = await _json(request)
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
        raise E2BError(400, f"count must be a whole number from 1 to {MAX_FORKS}, got "
                       f"{count!r}")
    timeout = _timeout_of(body)
    if not isinstance(session.sandbox, Snapshottable):
        raise E2BError(501, f"the {state.config.tier} tier cannot fork a session (the "
                       "namespace tier can)")
    sessions = state.sessions
    mine = max(0, sessions.per_client - sessions.held(box.owner))
    anyone = max(0, sessions.limit - len(sessions))
    n = min(count, mine, anyone)
    async with session.lock:
        with _as_e2b():
            children = list(await session.sandbox.fork(n, session.limits)) if n else []
    results: list[dict[str, Any]] = []
    for child in children:
        opened = sessions.add(child, session.limits, box.owner)
        state.counters.sessions_opened += 1
        now = datetime.now(UTC)
        twin = E2BSandbox(sandbox_id=opened.id, template_id=box.template_id,
                          owner=box.owner, access_token=secrets.token_urlsafe(24),
                          started_at=now, end_at=now, metadata=dict(box.metadata),
                          env_vars=dict(box.env_vars))
        _set_timeout(twin, opened, timeout)
        registry(request).add(twin)
        results.append({"sandbox": _created(twin)})
    for _ in range(count - len(children)):
        code, why = ((429, f"this client holds {sessions.held(box.owner)} sessions, the "
                      "most one client may; kill some first") if mine < count else
                     (503, f"{len(sessions)} sessions are open, the server's limit"))
        results.append({"error": {"code": code, "message": why}})
    return results


@router.post("/sandboxes/{sid}/snapshots")
@router.get("/sandboxes/{sid}/metrics")
@router.get("/sandboxes/{sid}/logs")
@router.get("/v2/sandboxes/{sid}/logs")
async def not_built(sid: str, request: Request) -> None:
    _found(request, sid)
    raise E2BError(501, f"{request.url.path.rsplit('/', 1)[-1]} is not served by trialbox's "
                   "E2B API yet (docs/service.md, 'E2B-compatible API')")


@router.get("/snapshots")
async def snapshots(request: Request) -> None:
    raise E2BError(501, "snapshots are not served by trialbox's E2B API yet "
                   "(docs/service.md, 'E2B-compatible API')")


async def _e2b_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, E2BError)
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    return JSONResponse({"code": exc.status, "message": str(exc)}, status_code=exc.status,
                        headers=headers)


def install(app: FastAPI, state: ServiceState) -> None:
    """Mount the control API and the envd API (e2b_envd.py) on `app`. Without the `e2b`
    package (the `e2b` extra) there is no envd API and a create answers 501 saying so."""
    app.state.e2b = sandboxes = E2BSandboxes(state)
    app.add_exception_handler(E2BError, _e2b_error)
    app.include_router(router)
    try:
        from trialbox.service import e2b_envd
    except ImportError as e:
        sandboxes.missing = (f"the E2B API needs the e2b package ({e}); install "
                             "trialbox[e2b] where the server runs")
        return
    e2b_envd.install(app, state, sandboxes)
