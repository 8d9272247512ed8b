"""E2B's own SDK (the `e2b` package, unmodified) against a real `trialbox serve`, pointed
at it only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (docs/service.md, "E2B-
compatible API"). The server has a token: the SDK sends it as its API key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    TimeoutException,
)

from tests.service.conftest import Server, wait_for

TOKEN = "e2b-test-token"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(token=TOKEN)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("E2B_API_URL", s.url), ("E2B_SANDBOX_URL", s.url),
                            ("E2B_API_KEY", TOKEN)):
            mp.setenv(name, value)
        mp.delenv("E2B_DOMAIN", raising=False)
        yield s
    s.stop()


@pytest.fixture(scope="module")
def sandbox(server: Server) -> Iterator[Sandbox]:
    """One sandbox for the tests that only run commands and files in it."""
    sb = Sandbox.create()
    yield sb
    sb.kill()


def test_lifecycle_create_get_list_timeout_kill(server: Server) -> None:
    sb = Sandbox.create(metadata={"run": "lifecycle"})
    info = sb.get_info()
    assert (info.sandbox_id, info.template_id, info.state.value, info.metadata) == (
        sb.sandbox_id, "base", "running", {"run": "lifecycle"})
    listed = Sandbox.list().next_items()
    assert sb.sandbox_id in [s.sandbox_id for s in listed]
    sb.set_timeout(3600)
    assert (sb.get_info().end_at - info.started_at).total_seconds() > 3000
    assert sb.is_running()

    sb.kill()
    assert not sb.is_running()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sb.sandbox_id)
    with pytest.raises(SandboxNotRunningException):
        sb.commands.run("echo late")
    assert Sandbox.kill(sb.sandbox_id) is False


def test_expired_sandbox_is_gone(server: Server) -> None:
    """Past its timeout the server's reaper closes the session (every few seconds)."""
    sb = Sandbox.create(timeout=1)
    assert wait_for(lambda: not sb.is_running(), timeout=30)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sb.sandbox_id)
    with pytest.raises(SandboxNotRunningException):
        sb.files.read("anything")


@pytest.mark.parametrize("cmd, envs, stdout, stderr", [
    ("echo out; echo err >&2", None, "out\n", "err\n"),
    ("echo $GREETING; pwd", {"GREETING": "hi"}, "hi\n/workspace\n", ""),
    ("printf '%s' \"$(head -c 200000 /dev/zero | tr '\\0' x)\"", None, "x" * 200_000, ""),
])
def test_commands_run(sandbox: Sandbox, cmd: str, envs: dict[str, str] | None,
                      stdout: str, stderr: str) -> None:
    result = sandbox.commands.run(cmd, envs=envs)
    assert (result.stdout, result.stderr, result.exit_code) == (stdout, stderr, 0)


def test_failing_command_raises_command_exit(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo bad >&2; exit 3")
    assert (e.value.exit_code, e.value.stderr) == (3, "bad\n")


def test_command_past_its_timeout(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    assert sandbox.commands.run("echo next").stdout == "next\n"  # the sandbox goes on


def test_background_command_listed_and_killed(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as e:
        handle.wait()
    assert e.value.exit_code == -1
    assert sandbox.commands.list() == []
    # one command at a time: killing one that waits behind another leaves that one be
    first = sandbox.commands.run("sleep 1; echo first", background=True)
    second = sandbox.commands.run("echo second", background=True)
    assert second.kill() is True
    assert first.wait().stdout == "first\n"
    with pytest.raises(CommandExitException) as killed:
        second.wait()
    assert (killed.value.exit_code, killed.value.error) == (-1, "killed before it started")


def test_files(sandbox: Sandbox) -> None:
    files = sandbox.files
    info = files.write("dir/a.txt", "hello")
    assert (info.name, info.path) == ("a.txt", "/workspace/dir/a.txt")
    assert files.read("/workspace/dir/a.txt") == "hello"
    blob = bytes(range(256)) * 4
    files.write("blob.bin", blob)
    assert bytes(files.read("blob.bin", format="bytes")) == blob
    assert sandbox.commands.run("cat dir/a.txt").stdout == "hello"  # what commands see
    sandbox.commands.run("echo made > dir/b.txt")
    assert files.read("dir/b.txt") == "made\n"

    assert sorted(e.name for e in files.list("dir")) == ["a.txt", "b.txt"]
    assert (files.get_info("dir").type, files.get_info("dir/a.txt").size) == (FileType.DIR, 5)
    assert files.make_dir("dir/sub") is True and files.make_dir("dir/sub") is False
    assert files.rename("dir/a.txt", "dir/sub/c.txt").path == "/workspace/dir/sub/c.txt"
    assert [e.name for e in files.list("dir", depth=2)] == ["b.txt", "sub", "c.txt"]
    assert files.exists("dir/sub/c.txt") and not files.exists("dir/a.txt")
    files.remove("dir")
    assert not files.exists("dir")


def test_files_bad_paths(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sandbox.files.read("no-such-file")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("/etc/passwd-not", "x")  # uploads only in the workspace
    with pytest.raises(NotFoundException):
        sandbox.files.remove("no-such-file")
    # refused from its Content-Length, unread, the connection closed (docs/service.md):
    # the SDK sees the 413 if it finished sending first, else the closed connection
    with pytest.raises((SandboxException, httpx.TransportError)) as big:
        sandbox.files.write("big.bin", b"x" * (17 << 20))  # the server's --max-body-mb 16
    if isinstance(big.value, SandboxException):
        assert "413: request body" in str(big.value)
    with pytest.raises(InvalidArgumentException, match="compressed uploads"):
        sandbox.files.write("z.txt", "zipped", gzip=True)


def test_pause_keeps_files_and_connect_resumes(server: Server) -> None:
    sb = Sandbox.create()
    try:
        sb.files.write("kept.txt", "still here")
        assert sb.pause() is True
        assert sb.pause() is False  # already paused
        assert Sandbox.get_info(sb.sandbox_id).state.value == "paused"
        with pytest.raises(SandboxException):
            sb.commands.run("true")
        again = Sandbox.connect(sb.sandbox_id)  # resumes (201)
        assert again.commands.run("cat kept.txt").stdout == "still here"
        assert Sandbox.connect(sb.sandbox_id).commands.run("true").exit_code == 0  # (200)
    finally:
        sb.kill()


def test_fork_copies_files_not_changes_after(server: Server) -> None:
    parent = Sandbox.create(envs={"ORIGIN": "parent-env"})
    kids: list[Sandbox | Exception] = []
    try:
        parent.files.write("state.txt", "before")
        kids = parent.fork(count=2)
        assert all(isinstance(k, Sandbox) for k in kids), kids
        for i, kid in enumerate(kids):
            assert isinstance(kid, Sandbox)
            assert kid.commands.run("cat state.txt; echo \" $ORIGIN\"").stdout == \
                "before parent-env\n"
            kid.files.write("state.txt", f"kid {i}")
        assert parent.files.read("state.txt") == "before"
        assert [k.files.read("state.txt") for k in kids if isinstance(k, Sandbox)] == \
            ["kid 0", "kid 1"]
    finally:
        for sb in (parent, *[k for k in kids if isinstance(k, Sandbox)]):
            sb.kill()


def test_refused_with_the_reason(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="501: snapshots"):
        sandbox.create_snapshot()
    with pytest.raises(SandboxException, match="501: snapshots"):
        Sandbox.list_snapshots().next_items()
    with pytest.raises(SandboxException, match="stdin=True is not served"):
        sandbox.commands.run("cat", stdin=True)


def test_unknown_sandbox_template_and_key(server: Server) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("s-0123456789abcdef")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("s-0123456789abcdef")
    assert Sandbox.kill("s-0123456789abcdef") is False
    with pytest.raises(SandboxException) as e:
        Sandbox.create("no-such-template")
    assert e.value.status_code == 404 and "no-such-template" in str(e.value)
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-token")


def test_async_sdk(server: Server) -> None:
    """`AsyncSandbox` speaks the same API over its async transports."""
    async def body() -> tuple[str, str]:
        sb = await AsyncSandbox.create()
        try:
            await sb.files.write("note.txt", "async")
            ran = await sb.commands.run("cat note.txt; echo oops >&2")
            return ran.stdout, ran.stderr
        finally:
            await sb.kill()

    assert asyncio.run(body()) == ("async", "oops\n")


def test_second_client_sees_nothing(server: Server, sandbox: Sandbox) -> None:
    """Another client (another address: the service's tenant key) with the same token
    neither lists, reads, kills nor reaches the envd API of this client's sandbox."""
    sid = sandbox.sandbox_id
    other = httpx.Client(base_url=server.url, headers={"X-API-KEY": TOKEN},
                         transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    with other:
        assert other.get("/v2/sandboxes").json() == []
        for method in ("GET", "DELETE"):
            r = other.request(method, f"/sandboxes/{sid}")
            assert (r.status_code, r.json()["code"]) == (404, 404)
        r = other.get("/files", params={"path": "x"}, headers={"E2b-Sandbox-Id": sid})
        assert r.status_code == 502 and "was not found" in r.json()["message"]
        r = other.get("/files", params={"path": "x"},
                      headers={"E2b-Sandbox-Id": sid, "X-Access-Token": "guess"})
        assert r.status_code == 502
    assert sandbox.commands.run("echo mine").stdout == "mine\n"


def test_no_answer_was_a_500(server: Server) -> None:
    with server.client() as c:
        responses = c.get("/v1/status").json()["counters"]["responses"]
    assert "500" not in responses, responses
