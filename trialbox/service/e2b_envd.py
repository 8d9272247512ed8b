"""The E2B in-sandbox API (envd), served for the sandboxes of e2b.py.

The SDK sends these to `E2B_SANDBOX_URL` (this server) with `E2b-Sandbox-Id: <id>` and
`X-Access-Token: <the sandbox's envd access token>`; both must name a live sandbox,
else the answer is E2B's proxy's "sandbox … was not found" (the SDK's
`SandboxNotRunningException`) — a wrong token and another client's id read the same as
an unknown one. The Guard's other checks (Host, size, rate) apply; its bearer token is
not asked for: the SDK never sends it here (ServiceState.own_auth_paths).

    /process.Process/*        Connect RPC, served by the SDK's own generated ASGI apps
    /filesystem.Filesystem/*  (process_connect, filesystem_connect; JSON or proto)
    GET  /files?path=P        download one workspace file
    POST /files?path=P        upload: multipart/form-data or application/octet-stream
    GET  /health              204

What runs: `Process.Start` runs the command (the SDK's `/bin/bash -l -c CMD`) as one
`exec` of the session through `v1._in_session` (its lock, a scheduler slot, the
request's deadline, parked afterwards), then streams the start event, the output and
the end event: output arrives when the command ends, not while it runs (the `Sandbox`
interface returns a run whole). `SendSignal` stops the run in flight. Stat, ListDir,
MakeDir, Move and Remove run a small program (`FS_PROGRAM`) inside the sandbox, so they
see exactly what commands see. Refused (UNIMPLEMENTED, saying so): stdin, PTY,
`Connect`/`Update` to a process, watches. Relative paths are in the workspace
(/workspace, the commands' working directory); uploads and downloads only there.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.parser
import email.policy
import json
import posixpath
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_connect as fs_connect
from e2b.envd.filesystem import filesystem_pb as fs
from e2b.envd.process import process_connect
from e2b.envd.process import process_pb as pb
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp
from starlette.types import ASGIApp, Receive, Scope, Send

from trialbox.errors import InfraError, UsageError
from trialbox.service.admission import Overloaded
from trialbox.service.e2b import E2BSandbox, E2BSandboxes
from trialbox.service.errors import DeadlineExpired
from trialbox.service.state import ServiceState, Session
from trialbox.types import ExecResult, ExecStatus, Limits

WORKSPACE = "/workspace"
CHUNK = 64 << 10
"""Output is sent in data events of at most this many bytes."""
PROCESS_PATH, FS_PATH = "/process.Process", "/filesystem.Filesystem"
KILL_EVERY_S, KILL_TRIES = 0.01, 500
"""SendSignal stops the command's run every 10 ms until it has ended (at most 5 s)."""

_scope: contextvars.ContextVar[Scope] = contextvars.ContextVar("e2b_envd_scope")
"""The ASGI scope of the RPC being served: the Guard's deadline and client are in it."""

# Runs inside the sandbox under its own python3: one filesystem operation, answered as
# one JSON line {"ok": …} or {"error": "not_found"|"exists"|"invalid", "message": …}.
FS_PROGRAM = r"""
import json, os, shutil, stat, sys
op, a = sys.argv[1], json.loads(sys.argv[2])
def info(p):
    st = os.lstat(p)
    link = stat.S_ISLNK(st.st_mode)
    target = None
    if link:
        target = os.readlink(p)
        try:
            st = os.stat(p)
        except OSError:
            pass
    return {"name": os.path.basename(os.path.normpath(p)), "path": os.path.abspath(p),
            "dir": stat.S_ISDIR(st.st_mode), "link": link, "target": target,
            "size": st.st_size, "mode": stat.S_IMODE(st.st_mode),
            "permissions": stat.filemode(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
            "mtime": st.st_mtime}
def walk(p, depth):
    out = []
    for name in sorted(os.listdir(p)):
        q = os.path.join(p, name)
        e = info(q)
        out.append(e)
        if depth > 1 and e["dir"] and not e["link"]:
            out += walk(q, depth - 1)
    return out
try:
    if op == "stat":
        r = info(a["path"])
    elif op == "list":
        if not os.path.isdir(a["path"]):
            raise NotADirectoryError(a["path"] + " is not a directory")
        r = walk(a["path"], a["depth"])
    elif op == "mkdir":
        if os.path.lexists(a["path"]):
            raise FileExistsError(a["path"] + " already exists")
        os.makedirs(a["path"])
        r = info(a["path"])
    elif op == "move":
        os.rename(a["source"], a["destination"])
        r = info(a["destination"])
    else:
        p = a["path"]
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.remove(p)
        r = None
    print(json.dumps({"ok": r}))
except FileNotFoundError as e:
    print(json.dumps({"error": "not_found", "message": str(e)}))
except FileExistsError as e:
    print(json.dumps({"error": "exists", "message": str(e)}))
except OSError as e:
    print(json.dumps({"error": "invalid", "message": str(e)}))
"""


def _not_found(sid: str) -> str:
    # E2B's proxy words it so; the SDK reads "was not found" as SandboxNotRunning
    return (f"The sandbox {sid} was not found (killed, past its timeout, or never "
            "created)")


class Envd:
    """Finds a request's sandbox and runs work in its session."""

    def __init__(self, state: ServiceState, sandboxes: E2BSandboxes):
        self.state, self.sandboxes = state, sandboxes

    def lookup(self, headers: Any) -> tuple[E2BSandbox, Session] | str:
        """The sandbox the headers name and prove access to, else why not (a message
        that reads the same for unknown, closed, or a wrong token)."""
        sid = headers.get("e2b-sandbox-id") or ""
        found = self.sandboxes.find(sid)
        if found is None or not found[0].token_ok(headers.get("x-access-token") or ""):
            return _not_found(sid)
        if found[0].paused:
            return (f"sandbox {sid} is paused; resume it (Sandbox.connect) before using "
                    "it")
        return found

    def rpc_sandbox(self, ctx: RequestContext[Any, Any]) -> tuple[E2BSandbox, Session]:
        found = self.lookup(ctx.request_headers)
        if isinstance(found, str):
            raise ConnectError(Code.UNAVAILABLE, found)
        return found

    async def run(self, box: E2BSandbox, session: Session, argv: list[str],
                  env: dict[str, str] | None = None, cwd: str = WORKSPACE,
                  limits: Limits | None = None, pid: int | None = None) -> ExecResult:
        """One command in the session, as `/v1/sessions/{id}/exec` runs it; not run
        when process `pid` was killed while it waited for the session."""
        from starlette.requests import Request

        from trialbox.service.v1 import _in_session
        request = Request(_scope.get())
        merged = {**box.env_vars, **(env or {})} or None
        sb = session.sandbox

        async def work() -> ExecResult:
            if pid in box.killed:  # SendSignal came before the run began
                return ExecResult(ExecStatus.SIGNAL, signal=9, message="killed before "
                                  "it started")
            box.active = pid
            try:
                return await sb.exec(argv, limits=limits, env=merged, cwd=cwd)
            finally:
                box.active = None

        try:
            return await _in_session(self.state, request, session, work, "the command")
        except DeadlineExpired as e:
            raise ConnectError(Code.DEADLINE_EXCEEDED, str(e)) from None
        except Overloaded as e:
            raise ConnectError(Code.RESOURCE_EXHAUSTED, str(e)) from None
        except UsageError as e:
            raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None
        except InfraError as e:
            raise ConnectError(Code.INTERNAL, f"infrastructure failure (retry): {e}") from None

    async def fs(self, ctx: RequestContext[Any, Any], op: str, **args: Any) -> Any:
        box, session = self.rpc_sandbox(ctx)
        result = await self.run(box, session, ["python3", "-c", FS_PROGRAM, op,
                                               json.dumps(args)])
        try:
            answer = json.loads(result.stdout)
        except ValueError:
            raise ConnectError(Code.INTERNAL, f"the filesystem helper failed "
                               f"({result.status.value}): {result.stderr_text[-500:]}"
                               ) from None
        error = answer.get("error")
        if error is not None:
            code = {"not_found": Code.NOT_FOUND, "exists": Code.ALREADY_EXISTS}.get(
                error, Code.INVALID_ARGUMENT)
            raise ConnectError(code, answer["message"])
        return answer["ok"]


def _limits(state: ServiceState, ctx: RequestContext[Any, Any]) -> Limits:
    """The command's limits: the server's defaults, its wall and CPU time the SDK's
    `timeout` (the RPC's deadline), capped by the server's maximum."""
    base, cap = state.config.default_limits, state.config.max_limits
    timeout_ms = ctx.timeout_ms
    if not timeout_ms:
        return base.with_(wall_s=cap.wall_s, cpu_s=cap.cpu_s)
    seconds = min(max(timeout_ms / 1000, 0.1), cap.wall_s)
    return base.with_(wall_s=seconds, cpu_s=min(seconds, cap.cpu_s))


def _event(event: Any) -> pb.StartResponse:
    """`event`: a `Oneof` of `ProcessEvent.event` (start, data, end)."""
    return pb.StartResponse(event=pb.ProcessEvent(event=event))


def _end(result: ExecResult) -> pb.ProcessEvent.EndEvent:
    """E2B's end event: `exited` and the code for a process that exited; -1 and the
    reason for one that was killed (its own signal, or a limit)."""
    if result.exit_code is not None and result.status in (ExecStatus.OK, ExecStatus.EXIT):
        return pb.ProcessEvent.EndEvent(exit_code=result.exit_code, exited=True,
                                        status=f"exit status {result.exit_code}")
    why = result.message or result.status.value
    status = f"signal: {result.signal}" if result.signal else result.status.value
    return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=status, error=why)


class Process(process_connect.Process):
    """`process.Process` (process.proto, as the SDK ships it)."""

    def __init__(self, envd: Envd):
        self.envd = envd

    async def start(self, request: pb.StartRequest,
                    ctx: RequestContext[pb.StartRequest, pb.StartResponse]
                    ) -> AsyncIterator[pb.StartResponse]:
        box, session = self.envd.rpc_sandbox(ctx)
        if request.pty is not None:
            raise ConnectError(Code.UNIMPLEMENTED, "PTY sessions are not served by "
                               "trialbox's E2B API")
        if request.stdin:
            raise ConnectError(Code.UNIMPLEMENTED, "stdin=True is not served: a command's "
                               "input cannot be streamed into a trialbox run; write a file "
                               "and redirect it")
        config = request.process or pb.ProcessConfig()
        argv = [config.cmd, *config.args]
        pid = next(box.pids)
        box.running[pid] = argv
        try:
            yield _event(Oneof("start", pb.ProcessEvent.StartEvent(pid=pid)))
            result = await self.envd.run(box, session, argv, dict(config.envs),
                                         config.cwd or WORKSPACE,
                                         _limits(self.envd.state, ctx), pid)
        finally:
            box.running.pop(pid, None)
            box.killed.discard(pid)
        if result.status is ExecStatus.TIMEOUT:
            raise ConnectError(Code.DEADLINE_EXCEEDED, f"the command ran out of time: "
                               f"{result.message}")
        if result.status is ExecStatus.INFRA:
            raise ConnectError(Code.INTERNAL, f"infrastructure failure (retry): "
                               f"{result.message}")
        for stream, data in (("stdout", result.stdout), ("stderr", result.stderr)):
            for i in range(0, len(data), CHUNK):
                output: Any = Oneof(stream, data[i:i + CHUNK])  # stdout | stderr
                yield _event(Oneof("data", pb.ProcessEvent.DataEvent(output=output)))
        yield _event(Oneof("end", _end(result)))

    async def list(self, request: pb.ListRequest,
                   ctx: RequestContext[pb.ListRequest, pb.ListResponse]) -> pb.ListResponse:
        box, _ = self.envd.rpc_sandbox(ctx)
        return pb.ListResponse(processes=[
            pb.ProcessInfo(pid=pid, config=pb.ProcessConfig(cmd=argv[0], args=argv[1:]))
            for pid, argv in sorted(box.running.items())])

    async def send_signal(self, request: pb.SendSignalRequest,
                          ctx: RequestContext[pb.SendSignalRequest, pb.SendSignalResponse]
                          ) -> pb.SendSignalResponse:
        """SIGKILL or SIGTERM: the run in flight is stopped (every process of it)."""
        box, session = self.envd.rpc_sandbox(ctx)
        selector = request.process.selector if request.process else None
        pid = selector.value if isinstance(selector, Oneof) and selector.field == "pid" \
            else None
        if pid not in box.running:
            raise ConnectError(Code.NOT_FOUND, f"process {pid} not found")
        box.killed.add(pid)  # in case its run has not begun: it never will
        # A stop that lands as the run begins, before its process exists, kills nothing:
        # stop it again until it is over (only while it is the run in flight).
        for _ in range(KILL_TRIES):
            if pid not in box.running:
                break
            if box.active == pid:
                await session.sandbox.stop()
            await asyncio.sleep(KILL_EVERY_S)
        return pb.SendSignalResponse()

    def connect(self, request: pb.ConnectRequest,
                ctx: RequestContext[pb.ConnectRequest, pb.ConnectResponse]
                ) -> AsyncIterator[pb.ConnectResponse]:
        raise ConnectError(Code.UNIMPLEMENTED, "connecting to a running command is not "
                           "served (keep the handle that started it)")

    async def update(self, request: pb.UpdateRequest,
                     ctx: RequestContext[pb.UpdateRequest, pb.UpdateResponse]
                     ) -> pb.UpdateResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "PTY sessions are not served")

    async def stream_input(self, request: AsyncIterator[pb.StreamInputRequest],
                           ctx: RequestContext[pb.StreamInputRequest, pb.StreamInputResponse]
                           ) -> pb.StreamInputResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "stdin is not served")

    async def send_input(self, request: pb.SendInputRequest,
                         ctx: RequestContext[pb.SendInputRequest, pb.SendInputResponse]
                         ) -> pb.SendInputResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "stdin is not served")

    async def close_stdin(self, request: pb.CloseStdinRequest,
                          ctx: RequestContext[pb.CloseStdinRequest, pb.CloseStdinResponse]
                          ) -> pb.CloseStdinResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "stdin is not served")


def _entry(e: dict[str, Any]) -> fs.EntryInfo:
    kind = fs.FileType.DIRECTORY if e["dir"] else fs.FileType.FILE
    seconds = int(e["mtime"])
    entry = fs.EntryInfo(
        name=e["name"], type=kind, path=e["path"], size=e["size"], mode=e["mode"],
        permissions=e["permissions"], owner=str(e["uid"]), group=str(e["gid"]),
        modified_time=Timestamp(seconds=seconds, nanos=int((e["mtime"] - seconds) * 1e9)),
        is_symlink=e["link"])
    if e["target"] is not None:
        entry.symlink_target = e["target"]
    return entry


class Filesystem(fs_connect.Filesystem):
    """`filesystem.Filesystem`: each call one run of `FS_PROGRAM` in the sandbox."""

    def __init__(self, envd: Envd):
        self.envd = envd

    async def stat(self, request: fs.StatRequest,
                   ctx: RequestContext[fs.StatRequest, fs.StatResponse]) -> fs.StatResponse:
        return fs.StatResponse(entry=_entry(await self.envd.fs(ctx, "stat",
                                                               path=request.path)))

    async def list_dir(self, request: fs.ListDirRequest,
                       ctx: RequestContext[fs.ListDirRequest, fs.ListDirResponse]
                       ) -> fs.ListDirResponse:
        depth = request.depth or 1
        found = await self.envd.fs(ctx, "list", path=request.path, depth=depth)
        return fs.ListDirResponse(entries=[_entry(e) for e in found])

    async def make_dir(self, request: fs.MakeDirRequest,
                       ctx: RequestContext[fs.MakeDirRequest, fs.MakeDirResponse]
                       ) -> fs.MakeDirResponse:
        return fs.MakeDirResponse(entry=_entry(await self.envd.fs(ctx, "mkdir",
                                                                  path=request.path)))

    async def move(self, request: fs.MoveRequest,
                   ctx: RequestContext[fs.MoveRequest, fs.MoveResponse]) -> fs.MoveResponse:
        return fs.MoveResponse(entry=_entry(await self.envd.fs(
            ctx, "move", source=request.source, destination=request.destination)))

    async def remove(self, request: fs.RemoveRequest,
                     ctx: RequestContext[fs.RemoveRequest, fs.RemoveResponse]
                     ) -> fs.RemoveResponse:
        await self.envd.fs(ctx, "remove", path=request.path)
        return fs.RemoveResponse()

    def watch_dir(self, request: fs.WatchDirRequest,
                  ctx: RequestContext[fs.WatchDirRequest, fs.WatchDirResponse]
                  ) -> AsyncIterator[fs.WatchDirResponse]:
        raise ConnectError(Code.UNIMPLEMENTED, "watching a directory is not served")

    async def create_watcher(self, request: fs.CreateWatcherRequest,
                             ctx: RequestContext[fs.CreateWatcherRequest,
                                                 fs.CreateWatcherResponse]
                             ) -> fs.CreateWatcherResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "watching a directory is not served")

    async def get_watcher_events(self, request: fs.GetWatcherEventsRequest,
                                 ctx: RequestContext[fs.GetWatcherEventsRequest,
                                                     fs.GetWatcherEventsResponse]
                                 ) -> fs.GetWatcherEventsResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "watching a directory is not served")

    async def remove_watcher(self, request: fs.RemoveWatcherRequest,
                             ctx: RequestContext[fs.RemoveWatcherRequest,
                                                 fs.RemoveWatcherResponse]
                             ) -> fs.RemoveWatcherResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "watching a directory is not served")


class _WithScope:
    """Runs an ASGI app with its scope in `_scope` (the RPC handlers read it)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _scope.set(scope)
        try:
            await self.app(scope, receive, send)
        finally:
            _scope.reset(token)


# ----------------------------------------------------------------------- /files

def _workspace_path(path: str) -> str:
    """`path` as the Sandbox file calls take it (relative to the workspace)."""
    full = posixpath.normpath(posixpath.join(WORKSPACE, path))
    if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
        raise UsageError(f"{path!r} is outside the workspace ({WORKSPACE}): uploads and "
                         "downloads are served there only")
    return posixpath.relpath(full, WORKSPACE)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _uploads(content_type: str, body: bytes, path: str | None) -> list[tuple[str, bytes]]:
    """(path, data) of each file in an upload: one octet-stream body (at `path`), or
    the parts of a multipart/form-data body (each at `path` when given, else at its
    filename, as envd does)."""
    if not content_type.startswith("multipart/"):
        if not path:
            raise UsageError("an octet-stream upload needs ?path=")
        return [(path, body)]
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    files = []
    for part in message.iter_parts():
        name = path or part.get_filename()
        if not name:
            raise UsageError("a multipart part without a filename and no ?path=")
        data = part.get_payload(decode=True)
        files.append((name, data if isinstance(data, bytes) else b""))
    return files


def install(app: FastAPI, state: ServiceState, sandboxes: E2BSandboxes) -> None:
    envd = Envd(state, sandboxes)
    state.own_auth_paths += [PROCESS_PATH + "/", FS_PATH + "/", "/files", "/health"]
    app.mount(PROCESS_PATH, _WithScope(process_connect.ProcessASGIApplication(
        Process(envd), read_max_bytes=state.config.max_body_bytes)))
    app.mount(FS_PATH, _WithScope(fs_connect.FilesystemASGIApplication(
        Filesystem(envd), read_max_bytes=state.config.max_body_bytes)))

    @app.get("/health", include_in_schema=False)
    async def health(request: Request) -> Response:
        found = envd.lookup(request.headers)
        if isinstance(found, str):
            return _error(502, found)
        return Response(status_code=204)

    @app.get("/files", include_in_schema=False)
    async def download(request: Request, path: str) -> Response:
        found = envd.lookup(request.headers)
        if isinstance(found, str):
            return _error(502, found)
        try:
            data = await found[1].sandbox.read_file(_workspace_path(path))
        except UsageError as e:
            return _error(404, str(e))
        return Response(data, media_type="application/octet-stream")

    @app.post("/files", include_in_schema=False)
    async def upload(request: Request, path: str | None = None) -> Response:
        found = envd.lookup(request.headers)
        if isinstance(found, str):
            return _error(502, found)
        session = found[1]
        if request.headers.get("content-encoding", "identity") != "identity":
            return _error(400, "compressed uploads (gzip=True) are not served; send the "
                          "file as it is")
        try:
            files = _uploads(request.headers.get("content-type", ""), await request.body(),
                             path)
            async with session.lock:
                for name, data in files:
                    await session.sandbox.write_file(_workspace_path(name), data)
        except UsageError as e:
            return _error(400, str(e))
        except OSError as e:  # the workspace is full (WorkspaceFull), …
            return _error(507, f"could not write: {e}")
        return JSONResponse([{"name": posixpath.basename(name), "type": "file",
                              "path": posixpath.join(WORKSPACE, _workspace_path(name))}
                             for name, _ in files])
