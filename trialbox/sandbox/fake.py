"""`FakeSandbox`: an in-memory stand-in for the `Sandbox` interface, for testing the
layers above (judge, scheduler, agent loop) without isolation or root.

It never runs anything: a `handler` you supply turns each command into an `ExecResult`.

    async def handler(argv, stdin, files):
        return ExecResult(ExecStatus.OK, exit_code=0, stdout=files["main.py"])

    async with FakeSandbox(handler) as sb:
        await sb.write_file("main.py", b"print(1)")
        assert (await sb.exec(["python3", "main.py"])).stdout == b"print(1)"
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

from trialbox.errors import UsageError
from trialbox.sandbox.mounts import _parts
from trialbox.types import ExecResult, ExecStatus, Limits, Runtime

Handler = Callable[[list[str], bytes, dict[str, bytes]], Awaitable[ExecResult]]


async def _ok(argv: list[str], stdin: bytes, files: dict[str, bytes]) -> ExecResult:
    return ExecResult(ExecStatus.OK, exit_code=0, tier="fake")


class FakeSandbox:
    """Records every call in `calls`; files live in the `files` dict."""

    tier = "fake"

    def __init__(self, handler: Handler = _ok, limits: Limits | None = None):
        self.handler = handler
        self.limits = limits or Limits()
        self.files: dict[str, bytes] = {}
        self.calls: list[list[str]] = []
        self.closed = False
        self.parks = 0

    async def exec(self, argv: Sequence[str], *, stdin: bytes = b"",
                   limits: Limits | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = "/workspace",
                   pass_fds: Mapping[int, int] | None = None,
                   last: bool = False) -> ExecResult:
        if self.closed:
            raise UsageError("this sandbox session is closed; open a new one")
        if isinstance(argv, (str, bytes)) or not argv:
            raise UsageError("argv must be a non-empty list of strings")
        self.calls.append(list(argv))
        for fd in (pass_fds or {}).values():  # same ownership rule as the real tiers
            os.close(fd)
        return await self.handler(list(argv), bytes(stdin), self.files)

    async def stop(self) -> None:
        """Nothing runs in the fake between calls."""

    async def park(self) -> None:
        """Counted in `parks`; the fake holds no compute."""
        self.parks += 1

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if not isinstance(data, (bytes, bytearray)):
            raise UsageError("file data must be bytes")
        self.files["/".join(_parts(path))] = bytes(data)

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        key = "/".join(_parts(path))
        if key not in self.files:
            raise UsageError(f"no file {path!r} in the workspace")
        return self.files[key][:max_bytes]

    async def list_files(self) -> list[str]:
        return sorted(self.files)

    async def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> FakeSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


FAKE_RUNTIME = Runtime("fake", "/usr/bin/python3", "3.11")


class FakeProvider:
    """A `SandboxProvider` of `FakeSandbox` sessions, all with one `handler`; every session
    opened is kept in `opened` (in order) for tests to inspect.

        provider = FakeProvider(handler)
        judge_something(task, answer, provider)
        assert all(sb.closed for sb in provider.opened)
    """

    tier = "fake"

    def __init__(self, handler: Handler = _ok, runtime: Runtime = FAKE_RUNTIME, *,
                 passes_fds: bool = True):
        self.handler = handler
        self.runtime = runtime
        self.passes_fds = passes_fds
        """base.passes_fds: False plays a tier that cannot hand fds into a sandbox."""
        self.opened: list[FakeSandbox] = []

    async def open(self, limits: Limits | None = None) -> FakeSandbox:
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a trialbox.types.Limits, got "
                             f"{type(limits).__name__}; e.g. Limits(wall_s=2)")
        sb = FakeSandbox(self.handler, limits)
        self.opened.append(sb)
        return sb
