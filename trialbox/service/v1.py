"""The native API, under `/v1`.

    POST   /v1/sessions                      open a session        {limits?}
    GET    /v1/sessions/{sid}                the session and its files
    DELETE /v1/sessions/{sid}                close it
    POST   /v1/sessions/{sid}/run            run source code       {code, language, …}
    POST   /v1/sessions/{sid}/exec           run a command         {argv, stdin, …}
    PUT    /v1/sessions/{sid}/files          upload files          {files: {path: b64}}
    GET    /v1/sessions/{sid}/files/{path}   download one file     → {path, content_b64}
    POST   /v1/exec                          one-shot run in a fresh sandbox
    POST   /v1/submissions                   grade a completion    → grade and reward
    POST   /v1/submissions/batch             grade many
    GET    /v1/submissions/{id}              a graded submission
    GET    /v1/submissions                   the most recent ones
    GET    /v1/status                        queue, pool, sessions, counters

Every run result is `ExecResult.to_json()` (status ok|exit|signal|timeout|memory|output|
disk|infra, exit_code, stdout/stderr as text and base64, wall_ms, cpu_ms, …). A run the
machinery broke is `status: infra` inside a 200 for session runs (the session may still
be usable); grading reports it as outcome `infra` with reward null (excluded, never 0).

With `--backend ray` the sandboxes live on cluster nodes (cluster/serving.py). A one-shot
run or a grading whose node is lost is placed once more (`placed_twice`); a session whose
node is lost answers every later call with 503 `infra` naming the node (its files went
with it: open a new session).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from functools import cache
from typing import Any

from fastapi import APIRouter, Request

from trialbox.errors import InfraError, NodeLost, UsageError
from trialbox.judge.answer import answer_of
from trialbox.judge.evaluate import reward_of
from trialbox.judge.grade import grade as judge
from trialbox.sandbox.base import Sandbox
from trialbox.sandbox.languages import language as language_spec
from trialbox.sandbox.languages import run_code
from trialbox.service.admission import Ticket
from trialbox.service.errors import ClientLimit, DeadlineExpired, FieldError, NotFound
from trialbox.service.execute import deadline_of, guarded, placed_twice
from trialbox.service.models import (
    BatchIn,
    ExecIn,
    FilesIn,
    OneShotIn,
    RunIn,
    SessionIn,
    SubmissionIn,
    decode_b64,
    decode_files,
    encode_b64,
    resolve_limits,
)
from trialbox.service.names import (
    escaped,
    outside,
    read_all,
    read_named,
    shown,
    write_all,
)
from trialbox.service.state import ServiceState, Session
from trialbox.types import ExecResult, Grade, Limits, Task, TaskKind

router = APIRouter(prefix="/v1", tags=["v1"])


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


def _on_nodes(state: ServiceState) -> tuple[bool, list[str] | None]:
    """(True, what every live node offering the tier runs — None while none is live)
    when the sandboxes are a cluster's (`ServingProvider.languages`); (False, None) when
    they are on this machine."""
    languages = getattr(state.provider, "languages", None)
    return (True, languages()) if callable(languages) else (False, None)


def offer(state: ServiceState) -> list[str] | None:
    """The languages a request is checked against when the sandboxes are not on this
    machine (`serve --backend ray`); None: this machine's (`languages.offered`)."""
    from trialbox.sandbox.languages import LANGUAGES
    cluster, got = _on_nodes(state)
    if not cluster:
        return None
    # no live node to ask: any declared language passes this check and the placement
    # answers 503 (infrastructure): a missing node is never the caller's error
    return sorted(LANGUAGES) if got is None else list(got)


def client_of(request: Request) -> str:
    """The client the Guard keyed the request on (guard.client_key)."""
    key = getattr(request.state, "client", None)
    if key is None:  # not behind Guard (a bare app in a unit test)
        return request.client.host if request.client else "?"
    return str(key)


def _session(state: ServiceState, sid: str) -> Session:
    try:
        session = state.sessions.get(sid)
    except UsageError as e:
        raise NotFound(str(e)) from None
    if session.lost:
        raise NodeLost(session.lost)
    return session


def _lost(state: ServiceState, session: Session, e: NodeLost) -> NodeLost:
    """The session's cluster node is gone, and its files with it: say so now and on
    every later call (never a run's outcome, never a silent fresh session)."""
    if not session.lost:
        state.counters.sessions_lost += 1
        session.lost = (f"session {session.id} lived on cluster node "
                        f"{getattr(session.sandbox, 'node', '?')}, which was lost ({e}); "
                        "its files went with it. Open a new session (POST /v1/sessions) "
                        f"and run again; DELETE /v1/sessions/{session.id} forgets this one")
    return NodeLost(session.lost)


def _stdin(text: str, b64: str | None) -> bytes:
    return decode_b64(b64, "stdin_b64") if b64 is not None else text.encode()


def _count(state: ServiceState, result: ExecResult) -> ExecResult:
    state.counters.runs[result.status.value] += 1
    return result


# ----------------------------------------------------------------------- sessions

@router.post("/sessions", status_code=201)
async def open_session(body: SessionIn, request: Request) -> dict[str, Any]:
    """Open a sandbox session. Its files persist across runs until it is closed (or
    idle for the server's `session_idle_s`)."""
    state = _state(request)
    limits = resolve_limits(body.limits, state.config)
    owner = client_of(request)
    sessions = state.sessions
    if sessions.held(owner) >= sessions.per_client:
        state.counters.rejected["client_sessions"] += 1
        raise ClientLimit(f"this client ({owner}) holds {sessions.held(owner)} sessions, "
                          f"the most one client may (of the server's {sessions.limit}); "
                          "close some (DELETE /v1/sessions/{id}) first", 5)
    if sessions.full():
        state.counters.rejected["sessions"] += 1
        from trialbox.service.admission import Overloaded
        raise Overloaded(f"{len(sessions)} sessions are open, the server's limit; "
                         "close some (DELETE /v1/sessions/{id}) or retry later", 5)
    # A session outlives any one request: its sandbox is opened from the provider
    # directly, parked between runs; each run takes a scheduler slot (_in_session).
    # Nothing is in it yet: a cluster node lost while opening it costs one more try.
    provider = state.require_provider()
    with sessions.opening(owner):
        sb = await placed_twice(state, "opening the session",
                                lambda: provider.open(limits))
    session = sessions.add(sb, limits, owner)
    state.counters.sessions_opened += 1
    return {"session_id": session.id, "limits": asdict(limits)}


@router.get("/sessions/{sid}")
async def get_session(sid: str, request: Request) -> dict[str, Any]:
    state = _state(request)
    session = _session(state, sid)
    # Read-only: no need to wait for a run. The workspace is the candidate's: too many
    # files or directories too deep to list is said in `files_error`, not a failure.
    files: list[str] | None = None
    escapes: list[dict[str, str]] = []
    files_error = ""
    try:
        names = await session.sandbox.list_files()
        files = [shown(name) for name in names]
        escapes = [e for e in map(escaped, names) if e is not None]
    except UsageError as e:
        files_error = str(e)
    except NodeLost as e:
        raise _lost(state, session, e) from None
    out: dict[str, Any] = {"session_id": session.id, "limits": asdict(session.limits),
                           "created": session.created, "runs": session.runs,
                           "files": files}
    node = getattr(session.sandbox, "node", None)
    if node is not None:  # --backend ray: the cluster node holding it
        out["node"] = node
    if escapes:  # names that are not UTF-8, shown escaped in `files` (names.py)
        out["files_escaped"] = escapes
    if files_error:
        out["files_error"] = files_error
    return out


@router.delete("/sessions/{sid}")
async def close_session(sid: str, request: Request) -> dict[str, Any]:
    state = _state(request)
    session = state.sessions.pop(sid)
    if session is None:
        raise NotFound(f"no open session {sid!r}; nothing to close")
    await session.sandbox.close()  # stops a run in flight
    state.counters.sessions_closed += 1
    return {"session_id": sid, "closed": True}


async def _in_session(state: ServiceState, request: Request, session: Session,
                      work: Any, what: str) -> ExecResult:
    # Runs of one session are sequential; waiting for the one before counts against
    # this request's deadline too.
    try:
        async with asyncio.timeout(max(0.0, deadline_of(request) - time.monotonic())):
            await session.lock.acquire()
    except TimeoutError:
        state.counters.deadline_expired += 1
        raise DeadlineExpired(f"the request's deadline passed while session {session.id} "
                              "was busy with an earlier run; nothing was run") from None
    try:
        session.runs += 1
        result: ExecResult = await guarded(state, request, lambda ticket: work(),
                                           session.sandbox.stop, what, kind="session")
    except NodeLost as e:
        raise _lost(state, session, e) from None
    finally:
        session.lock.release()
    session.last_used = time.monotonic()
    # Compute goes back to the pool between runs; the files stay (Sandbox.park).
    await session.sandbox.park()
    return _count(state, result)


@router.post("/sessions/{sid}/run")
async def session_run(sid: str, body: RunIn, request: Request) -> dict[str, Any]:
    """Write `code` to the language's file in the session, compile if needed, run it."""
    state = _state(request)
    session = _session(state, sid)
    # unknown, or not run where the session is → 400 before anything runs
    language_spec(body.language, getattr(session.sandbox, "languages", None))
    limits = resolve_limits(body.limits, state.config) if body.limits else None
    stdin = _stdin(body.stdin, body.stdin_b64)
    sb = session.sandbox
    result = await _in_session(
        state, request, session,
        lambda: run_code(sb, body.code, body.language, stdin=stdin, args=body.args,
                         limits=limits), "the run")
    return result.to_json()


@router.post("/sessions/{sid}/exec")
async def session_exec(sid: str, body: ExecIn, request: Request) -> dict[str, Any]:
    """Run a command in the session's workspace."""
    state = _state(request)
    session = _session(state, sid)
    limits = resolve_limits(body.limits, state.config) if body.limits else None
    stdin = _stdin(body.stdin, body.stdin_b64)
    sb = session.sandbox
    result = await _in_session(state, request, session,
                               lambda: sb.exec(body.argv, stdin=stdin, limits=limits),
                               "the command")
    return result.to_json()


@router.put("/sessions/{sid}/files")
async def upload(sid: str, body: FilesIn, request: Request) -> dict[str, Any]:
    state = _state(request)
    session = _session(state, sid)
    files = decode_files(body.files)
    async with session.lock:
        try:
            for path, data in files.items():
                await session.sandbox.write_file(path, data)
        except NodeLost as e:
            raise _lost(state, session, e) from None
    return {"session_id": sid, "written": sorted(files),
            "bytes": sum(len(d) for d in files.values())}


@router.get("/sessions/{sid}/files/{path:path}")
async def download(sid: str, path: str, request: Request) -> dict[str, Any]:
    state = _state(request)
    session = _session(state, sid)
    try:  # read-only: no need to wait for a run (a file being written reads as it is)
        data = await read_named(session.sandbox, path)  # the escaped form too
    except UsageError as e:
        raise NotFound(str(e)) from None
    except NodeLost as e:
        raise _lost(state, session, e) from None
    return {"path": path, "size": len(data), "content_b64": encode_b64(data)}


# ----------------------------------------------------------------------- one-shot

async def one_shot(state: ServiceState, request: Request, body: OneShotIn,
                   files: dict[str, bytes], compile_limits: Limits | None = None,
                   kind: str = "exec") -> tuple[ExecResult, dict[str, str | None]]:
    """A fresh sandbox: write `files`, run, read `fetch_files` (None for a missing one),
    close. Shared by /v1/exec and /run_code."""
    language_spec(body.language, offer(state))
    for path in files:  # an absolute path where no file can go: refused before a slot
        outside(path)
    limits = resolve_limits(body.limits, state.config)
    stdin = _stdin(body.stdin, body.stdin_b64)
    state.require_provider()
    holder: list[Sandbox] = []

    async def work(ticket: Ticket) -> tuple[ExecResult, dict[str, str | None]]:
        ctx = ticket.ctx

        async def attempt() -> tuple[ExecResult, dict[str, str | None]]:
            # The scheduler's lease: EXECUTING only while this runs; the session opens
            # from the provider here and is closed before the lease ends (a one-shot
            # never needs it parked).
            async with ctx.lease(limits) as sb:
                holder[:] = [sb]
                await write_all(sb, files)  # absolute paths: names.py
                result = await run_code(sb, body.code, body.language, stdin=stdin,
                                        args=body.args, limits=limits,
                                        compile_limits=compile_limits)
                fetched = {path: None if data is None else encode_b64(data)
                           for path, data in (await read_all(sb, body.fetch_files)).items()}
                await ctx.leaser.end(ctx.task_id)
            return result, fetched

        result, fetched = await placed_twice(state, "the run", attempt,
                                             lambda: ctx.leaser.end(ctx.task_id))
        ctx.observe(result)
        ticket.reward = 1.0 if result.ok else 0.0
        return result, fetched

    async def stop() -> None:
        if holder:
            await holder[0].stop()

    result, fetched = await guarded(state, request, work, stop, "the run", kind=kind)
    _count(state, result)
    return result, fetched


@router.post("/exec")
async def exec_once(body: OneShotIn, request: Request) -> dict[str, Any]:
    """Run code once in a fresh sandbox: `files` written first, `fetch_files` returned
    (base64; null for a file the run did not leave)."""
    state = _state(request)
    result, fetched = await one_shot(state, request, body, decode_files(body.files))
    return {"result": result.to_json(), "files": fetched}


# ----------------------------------------------------------------------- grading

@cache
def _bundled() -> dict[str, Task]:
    from trialbox.store.tasks import index, load_humaneval
    return index(load_humaneval())


def _task_of(sub: SubmissionIn, field: str) -> Task:
    if (sub.task_id is None) == (sub.task is None):
        raise FieldError(f"{field}task_id", "give exactly one of task_id (a bundled task such as "
                         "'HumanEval/0') or task (an inline task object)")
    if sub.task_id is not None:
        task = _bundled().get(sub.task_id)
        if task is None:
            raise FieldError(f"{field}task_id", f"unknown task {sub.task_id!r}; bundled "
                             "tasks are HumanEval/0 … HumanEval/163, or send the task "
                             "inline in 'task'")
        return task
    # The JSONL row parser of the task store gives inline tasks exactly the validation
    # (and error messages naming the field) that task files get.
    from trialbox.store.tasks import parse_task
    try:
        return parse_task(sub.task or {}, f"{field}task", "request")
    except UsageError as e:
        raise FieldError(f"{field}task", str(e)) from None


def grade_row(sid: str, task: Task, grade: Grade, language: str) -> dict[str, Any]:
    return {"submission_id": sid, "task_id": task.task_id, "kind": task.kind.value,
            "language": language, "outcome": grade.outcome.value, "passed": grade.passed,
            "reward": reward_of(grade), "pass_rate": grade.pass_rate,
            "message": grade.message, "flags": list(grade.flags),
            "tests": [asdict(t) for t in grade.tests], "wall_ms": grade.wall_ms,
            "candidate_cpu_ms": grade.candidate_cpu_ms,
            "candidate_peak_memory_bytes": grade.candidate_peak_memory_bytes,
            "attempts": grade.attempts, "graded_at": time.time()}


async def _grade(state: ServiceState, request: Request, sub: SubmissionIn,
                 field: str = "") -> dict[str, Any]:
    task = _task_of(sub, field)
    if task.kind is TaskKind.STDIO:
        language_spec(sub.language, offer(state))
    elif task.kind is not TaskKind.FUNCTION:
        raise FieldError(f"{field}task", f"task kind {task.kind.value!r} cannot be graded "
                         "by the service; use function or stdio tasks")
    provider = state.require_provider()
    sid = state.submissions.new_id()
    code = answer_of(task, sub.completion, language=sub.language)  # as eval reads it

    async def work(ticket: Ticket) -> dict[str, Any]:
        await ticket.ctx.grading()
        if state.grader is not None:  # --backend ray: judged on a cluster node
            why = getattr(provider, "unavailable", lambda: "")()
            if why:  # the placer would wait for a node until the deadline: say it now
                raise InfraError(why)
            grade = await placed_twice(state, "the grading", lambda: state.grader.grade(
                task, code, sub.language))
        else:
            grade = await judge(task, code, provider, language=sub.language)
        row = grade_row(sid, task, grade, sub.language)
        await ticket.ctx.record_grade(row)
        ticket.reward = row["reward"]  # None (excluded): the task ends FAILED
        return row

    # No `stop`: the judge's sandboxes are its own; cancelling the judgement closes them
    # (and closing a sandbox kills its run).
    row = await guarded(state, request, work, None, "grading", kind="submission")
    state.counters.grades[row["outcome"]] += 1
    state.submissions.put(sid, row)
    return row


@router.post("/submissions")
async def submit(body: SubmissionIn, request: Request) -> dict[str, Any]:
    """Grade a completion with the trusted judge: outcome, per-test evidence, reward
    (null when excluded: infrastructure or the task's own tests failed)."""
    return await _grade(_state(request), request, body)


@router.post("/submissions/batch")
async def submit_batch(body: BatchIn, request: Request) -> dict[str, Any]:
    """Grade many completions, concurrently (each through the admission queue). Every
    item is checked first, so a bad one fails the batch before anything runs; an item
    refused for overload or deadline is reported in its place."""
    state = _state(request)
    for i, sub in enumerate(body.submissions):
        _task_of(sub, f"submissions[{i}].")
    # At most max_running items of one batch ask for a slot at once: a batch larger
    # than the admission queue must wait its turn, not be refused item by item.
    turn = asyncio.Semaphore(state.config.max_running)

    async def one(i: int, sub: SubmissionIn) -> dict[str, Any]:
        async with turn:
            return await _grade(state, request, sub, f"submissions[{i}].")

    results = await asyncio.gather(*(one(i, s) for i, s in enumerate(body.submissions)),
                                   return_exceptions=True)
    rows: list[dict[str, Any]] = []
    for r in results:
        if isinstance(r, BaseException):
            if not isinstance(r, Exception):
                raise r
            rows.append({"error": type(r).__name__, "message": str(r), "reward": None})
        else:
            rows.append(r)
    return {"results": rows}


@router.get("/submissions/{sid}")
async def get_submission(sid: str, request: Request) -> dict[str, Any]:
    try:
        return _state(request).submissions.get(sid)
    except UsageError as e:
        raise NotFound(str(e)) from None


@router.get("/submissions")
async def list_submissions(request: Request, limit: int = 50) -> dict[str, Any]:
    if not 1 <= limit <= 1000:
        raise FieldError("limit", f"must be between 1 and 1000, got {limit}")
    state = _state(request)
    return {"submissions": state.submissions.recent(limit), "total": len(state.submissions)}


@router.get("/languages")
async def languages(request: Request) -> dict[str, Any]:
    """The languages this server runs (their toolchains are installed where its
    sandboxes run: this machine, or with `--backend ray` every node offering the tier),
    and every language trialbox declares with what it needs."""
    from trialbox.sandbox.languages import ALIASES, LANGUAGES, offered
    cluster, got = _on_nodes(_state(request))
    if cluster:
        here, where = (got or []), ("the cluster's nodes" if got is not None
                                    else "the cluster's nodes (none live now)")
    else:
        here, where = offered(), "this machine"
    return {"languages": here, "aliases": ALIASES, "where": where,
            "declared": {name: {"available": name in here, "package": spec.package,
                                "needs": list(spec.needs)}
                         for name, spec in sorted(LANGUAGES.items())}}


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    """The server's live numbers: admission queue, pool, sessions, counters."""
    state = _state(request)
    c = state.counters
    provider = state.provider
    cluster_status = getattr(provider, "cluster_status", None)
    a = state.admission
    return {"ready": state.ready, "uptime_s": round(time.time() - state.started, 3),
            "admission": {"running": a.running, "queued": a.waiting,
                          "max_running": a.limit, "max_queued": a.queue_limit,
                          "admitted": a.admitted, "scheduler_run": a.run_id,
                          "journal": a.journal.path if a.journal else None},
            "pool": (cluster_status()  # --backend ray: the sessions per node
                     if cluster_status is not None
                     else {"tier": provider.tier if provider else None,
                           "warm_cells": getattr(provider, "ready_count", 0)}),
            "grading": (state.grader.status() if state.grader is not None
                        else {"backend": "local"}),
            "sessions": len(state.sessions),
            "submissions": len(state.submissions),
            "counters": {"requests": c.requests,
                         "responses": {str(k): v for k, v in c.responses.items()},
                         "runs": dict(c.runs), "grades": dict(c.grades),
                         "rejected": dict(c.rejected),
                         "deadline_expired": c.deadline_expired,
                         "sessions_opened": c.sessions_opened,
                         "sessions_closed": c.sessions_closed,
                         "sessions_lost": c.sessions_lost, "replaced": c.replaced}}
