"""Audit log: who ran what, when, in which tier, and what came of it — one JSON line per
sandbox session, on every tier, by wrapping the provider (STYLE.md 4).

    log = AuditLog(AuditConfig(path="/var/log/trialbox/audit.jsonl"))
    provider = audited(await CellPool(PoolConfig()).start(), log)   # or any tier's provider
    with audit_task("HumanEval/0"):                    # the task the next sessions serve
        async with await provider.open(Limits(wall_s=2)) as sb:
            await sb.exec(["python3", "-c", "print(1)"])
    log.close()                                        # flushes; also done at exit
    for s in query("/var/log/trialbox/audit.jsonl", task="HumanEval/0", status="timeout"):
        print(s.session, s.tier, [c.status for c in s.commands])

A session's record holds: who (user@host and pid, or `AuditConfig.who`), the task id
(from `audit_task`, if any), the tier, the runtime id (name and interpreter hash), the
session's limits, when it opened and closed, every command (argv cut to
`AuditConfig.max_arg_chars` per argument, with its full length; offset from the open,
status, exit code or signal, stdin/stdout/stderr bytes, wall/CPU ms, peak memory,
per-run limits when they differ, the limit hit if any, the error raised if any), files
written and read with their bytes, the totals, and — for a session with an allow-list
(`Limits.net_allow`) — the network attempts refused, counted outside the candidate by
the session's network gate (network.py; read once, after the session closes). A session
without one has no route out and no counter: its `network_refused` is null, not a
made-up zero.

Cost on the hot path: an `exec` appends one tuple (its start time and the argv, stdin
size, limits and result it already holds) to a list; the record is built, serialised
and written by the log's writer thread after the session closes (batched, one `write`
per batch on an `O_APPEND` descriptor, so several processes can share one file without
interleaving lines). So a session keeps its results (their stdout and stderr) until it
closes. docs/tiers.md gives the measured cost. A session never closed (the supervisor
was killed) is written by `AuditLog.close()` (also run at interpreter exit) with
`closed: false`; after `kill -9` it is lost.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import getpass
import itertools
import json
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.types import ExecResult, ExecStatus, Limits, Runtime

LIMIT_STATUSES = frozenset({ExecStatus.TIMEOUT, ExecStatus.MEMORY, ExecStatus.OUTPUT,
                            ExecStatus.DISK})


@dataclass(frozen=True)
class AuditConfig:
    """Where and how the audit log is written. Auditing is opt-in: wrap a provider
    with `audited(provider, AuditLog(config))`."""

    path: str
    """The JSON-lines file (appended to; created if missing)."""
    who: str = ""
    """Who runs the sessions (a user, a run id); default `user@host pid N`."""
    max_arg_chars: int = 256
    """Each argv element is cut to this many characters (its full length is kept)."""
    flush_s: float = 0.5
    """The writer thread writes what is queued at least this often."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise UsageError("AuditConfig.path must name a file, e.g. path='audit.jsonl'")
        if self.max_arg_chars < 0:
            raise UsageError(f"AuditConfig.max_arg_chars must be >= 0, got "
                             f"{self.max_arg_chars}")
        if not self.flush_s > 0:
            raise UsageError(f"AuditConfig.flush_s must be > 0 seconds, got {self.flush_s}")


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class CommandRecord:
    """One `exec` of a session."""

    argv: tuple[str, ...]
    argv_chars: tuple[int, ...]
    """Full length of each argv element (argv itself may be cut)."""
    t_ms: float
    """Start, in ms after the session opened."""
    status: str
    """An ExecStatus value, or `error` when the call raised (see `error`)."""
    exit_code: int | None = None
    signal: int | None = None
    stdin_bytes: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    truncated: bool = False
    wall_ms: float = 0.0
    cpu_ms: float = 0.0
    peak_memory_bytes: int = 0
    limit: str = ""
    """The limit the run hit (`timeout`, `memory`, `output`, `disk`), else ''."""
    limits: dict[str, Any] | None = None
    """This run's limits when given to `exec` (else the session's)."""
    message: str = ""
    error: str = ""
    """`ExceptionType: message` when the call raised instead of returning a result."""


@dataclass(frozen=True)
class SessionRecord:
    """One sandbox session: one line of the audit log."""

    session: str
    who: str
    task_id: str
    tier: str
    runtime: str
    limits: dict[str, Any]
    opened_at: float
    """Unix time."""
    closed_at: float
    closed: bool
    """False when written by `AuditLog.close()` for a session still open."""
    commands: tuple[CommandRecord, ...] = ()
    files_written: int = 0
    files_read: int = 0
    bytes_in: int = 0
    """stdin plus files written into the workspace."""
    bytes_out: int = 0
    """stdout, stderr plus files read out of the workspace."""
    limit_hits: dict[str, int] = field(default_factory=dict)
    network_refused: int | None = None
    """Connection attempts (and other packets) outside `Limits.net_allow` refused, counted
    by the network gate; None without an allow-list (no route out, nothing counted)."""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for c in d["commands"]:  # keep lines short: drop what is empty
            for k in ("limits", "message", "error", "limit", "signal"):
                if not c[k]:
                    del c[k]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SessionRecord:
        d = dict(d)
        d["commands"] = tuple(CommandRecord(**{**c, "argv": tuple(c["argv"]),
                                               "argv_chars": tuple(c["argv_chars"])})
                              for c in d.get("commands", ()))
        return cls(**d)


# --------------------------------------------------------------------------- the log

_task: contextvars.ContextVar[str] = contextvars.ContextVar("trialbox_audit_task", default="")


@contextlib.contextmanager
def audit_task(task_id: str) -> Iterator[None]:
    """Sessions opened inside this block (this task or coroutine and what it starts) are
    recorded under `task_id`; the layers in between need not know about auditing."""
    token = _task.set(str(task_id))
    try:
        yield
    finally:
        _task.reset(token)


class AuditLog:
    """A JSON-lines file fed by a writer thread. Thread- and coroutine-safe; one per file
    per process is enough (several processes may append to the same file)."""

    def __init__(self, config: AuditConfig):
        self.config = config
        self.who = config.who or f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
        try:
            self._fd = os.open(config.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o640)
        except OSError as e:
            raise UsageError(f"cannot open the audit log {config.path!r}: {e.strerror}; "
                             f"give AuditConfig.path a writable file") from e
        self._queue: queue.SimpleQueue[_Session | None] = queue.SimpleQueue()
        self._open: dict[int, _Session] = {}
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid()}-{int(time.time() * 1000):x}"
        self.written = 0
        self.closed = False
        self._thread = threading.Thread(target=self._writer, name="trialbox-audit",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _begin(self, tier: str, runtime: str, limits: Limits) -> _Session:
        if self.closed:
            raise UsageError("this audit log is closed; open a new AuditLog")
        s = _Session(f"{self._prefix}-{next(self._ids)}", _task.get(), tier, runtime, limits)
        self._open[id(s)] = s
        return s

    def _end(self, s: _Session) -> None:
        if self._open.pop(id(s), None) is not None:
            s.closed_at = time.time()
            self._queue.put(s)

    def close(self) -> None:
        """Write every session still open (`closed: false`), flush, stop the writer.
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        for s in list(self._open.values()):
            self._open.pop(id(s), None)
            self._queue.put(s)
        self._queue.put(None)
        self._thread.join()
        os.close(self._fd)
        atexit.unregister(self.close)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writer(self) -> None:
        done = False
        while not done:
            try:
                batch = [self._queue.get(timeout=self.config.flush_s)]
            except queue.Empty:
                continue
            while True:  # take everything queued: one write per batch
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines = []
            for s in batch:
                if s is None:
                    done = True
                else:
                    lines.append(json.dumps(s.record(self.who, self.config.max_arg_chars)
                                            .to_json(), separators=(",", ":")))
            if lines:
                data = ("\n".join(lines) + "\n").encode()
                while data:
                    data = data[os.write(self._fd, data):]
                self.written += len(lines)


class _Session:
    """What an audited session gathers while it runs: plain appends, nothing built."""

    __slots__ = ("id", "task_id", "tier", "runtime", "limits", "opened_at", "t0",
                 "closed_at", "runs", "files_written", "files_read", "bytes_written",
                 "bytes_read", "network_refused")

    def __init__(self, sid: str, task_id: str, tier: str, runtime: str, limits: Limits):
        self.id, self.task_id, self.tier, self.runtime = sid, task_id, tier, runtime
        self.limits = limits
        self.opened_at = time.time()
        self.t0 = time.monotonic()
        self.closed_at = 0.0
        # (start offset s, argv, stdin bytes, limits or None, ExecResult or exception)
        self.runs: list[tuple[float, Sequence[str], int, Limits | None,
                              ExecResult | BaseException]] = []
        self.files_written = self.files_read = self.bytes_written = self.bytes_read = 0
        self.network_refused: int | None = None

    def record(self, who: str, max_chars: int) -> SessionRecord:
        commands = []
        hits: dict[str, int] = {}
        bytes_in, bytes_out = self.bytes_written, self.bytes_read
        for t, argv, n_in, limits, r in self.runs:
            argv = [str(a) for a in argv]
            common: dict[str, Any] = dict(
                argv=tuple(a[:max_chars] for a in argv), argv_chars=tuple(len(a) for a in argv),
                t_ms=round(t * 1e3, 3), stdin_bytes=n_in,
                limits=asdict(limits) if limits is not None else None)
            bytes_in += n_in
            if isinstance(r, BaseException):
                commands.append(CommandRecord(status="error",
                                              error=f"{type(r).__name__}: {r}", **common))
                continue
            limit = r.status.value if r.status in LIMIT_STATUSES else ""
            if limit:
                hits[limit] = hits.get(limit, 0) + 1
            bytes_out += len(r.stdout) + len(r.stderr)
            commands.append(CommandRecord(
                status=r.status.value, exit_code=r.exit_code, signal=r.signal,
                stdout_bytes=len(r.stdout), stderr_bytes=len(r.stderr), truncated=r.truncated,
                wall_ms=r.wall_ms, cpu_ms=r.cpu_ms, peak_memory_bytes=r.peak_memory_bytes,
                limit=limit, message=r.message if r.status is not ExecStatus.OK else "",
                **common))
        return SessionRecord(
            session=self.id, who=who, task_id=self.task_id, tier=self.tier,
            runtime=self.runtime, limits=asdict(self.limits), opened_at=self.opened_at,
            closed_at=self.closed_at or time.time(), closed=bool(self.closed_at),
            commands=tuple(commands), files_written=self.files_written,
            files_read=self.files_read, bytes_in=bytes_in, bytes_out=bytes_out,
            limit_hits=hits, network_refused=self.network_refused)


# --------------------------------------------------------------------------- wrappers

class AuditedSandbox:
    """A `Sandbox` that records what passes through it into an `AuditLog`; everything
    else is the wrapped session's. Closing it writes the record."""

    def __init__(self, inner: Sandbox, log: AuditLog, runtime: str = ""):
        self.inner = inner
        self.tier = inner.tier
        self.limits = inner.limits
        self._log = log
        self._s = log._begin(inner.tier, runtime, inner.limits)

    async def exec(self, argv: Sequence[str], *, stdin: bytes = b"",
                   limits: Limits | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = "/workspace",
                   pass_fds: Mapping[int, int] | None = None,
                   last: bool = False) -> ExecResult:
        t = time.monotonic() - self._s.t0
        try:
            r = await self.inner.exec(argv, stdin=stdin, limits=limits, env=env, cwd=cwd,
                                      pass_fds=pass_fds, last=last)
        except BaseException as e:
            self._s.runs.append((t, argv, len(stdin), limits, e))
            raise
        self._s.runs.append((t, argv, len(stdin), limits, r))
        return r

    async def stop(self) -> None:
        await self.inner.stop()

    async def park(self) -> None:
        await self.inner.park()

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await self.inner.write_file(path, data, mode)
        self._s.files_written += 1
        self._s.bytes_written += len(data)

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        data = await self.inner.read_file(path, max_bytes)
        self._s.files_read += 1
        self._s.bytes_read += len(data)
        return data

    async def list_files(self) -> list[str]:
        return await self.inner.list_files()

    async def close(self) -> None:
        try:
            await self.inner.close()
            refused = getattr(self.inner, "network_refused", None)
            if self.inner.limits.net_allow and refused is not None:
                self._s.network_refused = await refused()  # the gate's final count
        finally:
            self._log._end(self._s)

    async def __aenter__(self) -> AuditedSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:  # tier-specific extras (e.g. the cell)
        return getattr(self.inner, name)


class AuditedProvider:
    """A `SandboxProvider` whose sessions are `AuditedSandbox`es. `start`, `close` and
    anything else tier-specific pass through to the wrapped provider."""

    def __init__(self, inner: SandboxProvider, log: AuditLog):
        self.inner = inner
        self.tier = inner.tier
        self.runtime: Runtime = inner.runtime
        self.log = log

    async def open(self, limits: Limits | None = None) -> AuditedSandbox:
        return AuditedSandbox(await self.inner.open(limits), self.log, self.runtime.id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def audited(provider: SandboxProvider, log: AuditLog | AuditConfig | None) -> SandboxProvider:
    """`provider` wrapped to write `log` (given, or opened from a config); `provider`
    itself when `log` is None (auditing off)."""
    if log is None:
        return provider
    if isinstance(log, AuditConfig):
        log = AuditLog(log)
    if not isinstance(log, AuditLog):
        raise UsageError(f"audited() takes an AuditLog, an AuditConfig or None, got "
                         f"{type(log).__name__}")
    return AuditedProvider(provider, log)


# --------------------------------------------------------------------------- queries

def read(path: str) -> Iterator[SessionRecord]:
    """Every session record of an audit log, in file order."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read the audit log {path!r}: {e.strerror}") from e
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield SessionRecord.from_json(json.loads(line))
            except (ValueError, TypeError, KeyError) as e:
                raise UsageError(f"{path}:{n} is not an audit record ({e}); is this the "
                                 f"file AuditConfig.path named?") from e


STATUSES = tuple(s.value for s in ExecStatus) + ("error",)


def query(path: str, task: str | None = None, status: str | None = None,
          tier: str | None = None) -> list[SessionRecord]:
    """Sessions of `task`, in `tier`, with at least one command that ended `status`
    (an ExecStatus value or `error`); each filter applies only when given."""
    if status is not None and status not in STATUSES:
        raise UsageError(f"unknown status {status!r}; one of: {', '.join(STATUSES)}")
    return [s for s in read(path)
            if (task is None or s.task_id == task)
            and (tier is None or s.tier == tier)
            and (status is None or any(c.status == status for c in s.commands))]


# --------------------------------------------------------------------------- command line

def add_parser(sub: Any) -> None:
    """`trialbox audit-log query --file F [--task T] [--status S] [--tier X]`."""
    p = sub.add_parser("audit-log", help="query a sandbox audit log (JSON lines, one per "
                       "session; written when a provider is wrapped with audited())")
    psub = p.add_subparsers(dest="audit_log", required=True)
    q = psub.add_parser("query", help="print the matching sessions, one JSON line each")
    q.add_argument("--file", required=True, help="the audit log (AuditConfig.path)")
    q.add_argument("--task", default=None, help="only sessions of this task id")
    q.add_argument("--status", default=None, choices=STATUSES,
                   help="only sessions with a command that ended so")
    q.add_argument("--tier", default=None, help="only sessions of this tier")
    q.add_argument("--count", action="store_true", help="print only the number of sessions")
    q.set_defaults(handler=_query_main)


def _query_main(args: Any) -> int:
    found = query(args.file, task=args.task, status=args.status, tier=args.tier)
    if args.count:
        print(len(found))
    else:
        for s in found:
            print(json.dumps(s.to_json(), separators=(",", ":")))
    return 0
