"""Misuse of the sandbox API raises UsageError (or a subclass) at once, with a message
that names what to change, and never hurts the pool: a good run follows each one.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import fields

import pytest

from tests.conftest import load_scaled
from tests.sandbox.conftest import FAST, describe, no_leaks
from trialbox.errors import InfraError, LimitsError, UnknownLanguage, UsageError
from trialbox.sandbox import NamespaceSandbox, open_sandbox, run_code
from trialbox.types import ExecStatus, Limits

NUMERIC_FIELDS = [f.name for f in fields(Limits) if f.name != "network"]


def assert_pool_serves(runner) -> None:
    """The pool still works after the misuse: a fresh session runs a program."""
    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
            return await run_code(sb, "print('still fine')")
    r = runner.run(body())
    assert (r.status, r.stdout) == (ExecStatus.OK, b"still fine\n"), describe(r)
    assert not runner.pool.closed
    no_leaks(runner)


# ------------------------------------------------------------------ limits


@pytest.mark.parametrize("value", [0, -1, -0.5, math.nan, math.inf, -math.inf],
                         ids=["zero", "negative", "negative-float", "nan", "inf", "-inf"])
@pytest.mark.parametrize("name", NUMERIC_FIELDS)
def test_bad_limit_value_names_the_field(name, value):
    with pytest.raises(LimitsError, match=rf"Limits\.{name}\b"):
        Limits(**{name: value})


@pytest.mark.parametrize("name, value", [
    ("wall_s", "10"), ("memory_mb", None), ("pids", True), ("cpus", [1]),
    ("network", "yes"), ("network", 1),
])
def test_wrong_limit_type_names_the_field(name, value):
    with pytest.raises(LimitsError, match=rf"Limits\.{name}\b"):
        Limits(**{name: value})


@pytest.mark.parametrize("changes, field", [
    ({"memory_mb": 8}, "memory_mb"), ({"pids": 2}, "pids"), ({"open_files": 4}, "open_files"),
    ({"output_bytes": 100}, "output_bytes"), ({"wall_s": 10**9}, "wall_s"),
])
def test_out_of_range_limit_names_the_field(changes, field):
    with pytest.raises(LimitsError, match=rf"Limits\.{field}\b"):
        Limits(**changes)
    with pytest.raises(LimitsError, match=rf"Limits\.{field}\b"):
        FAST.with_(**changes)


def test_limits_error_is_a_usage_error():
    assert issubclass(LimitsError, UsageError) and issubclass(UnknownLanguage, UsageError)
    assert not issubclass(UsageError, InfraError)


# ------------------------------------------------------------------ calls on a session


async def _misuse(runner, call):
    async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
        await sb.write_file("main.py", b"print(1)")
        await call(sb)


MISUSES = [
    # id, call(sb), exception, message fragment
    ("unknown-language", lambda sb: run_code(sb, "PROCEDURE DIVISION.", "cobol"),
     UnknownLanguage, r"'cobol'.*bash, c, cpp, .*python"),
    ("language-not-a-str", lambda sb: run_code(sb, "print(1)", None),  # type: ignore
     UnknownLanguage, r"python"),
    ("non-utf8-source-bytes", lambda sb: run_code(sb, b"print('\xff\xfe')"),
     UsageError, r"UTF-8"),
    ("source-not-text", lambda sb: run_code(sb, 12345),  # type: ignore
     UsageError, r"str or UTF-8 bytes"),
    ("missing-command", lambda sb: sb.exec(["definitely-not-a-command"]),
     UsageError, r"'definitely-not-a-command' not found"),
    ("missing-absolute-command", lambda sb: sb.exec(["/usr/bin/definitely-not-here"]),
     UsageError, r"does not exist"),
    ("host-only-command", lambda sb: sb.exec(["/etc/passwd"]),
     UsageError, r"does not exist"),
    ("argv-is-a-string", lambda sb: sb.exec("python3 main.py"),  # type: ignore
     UsageError, r"argv must be a non-empty list"),
    ("argv-is-bytes", lambda sb: sb.exec(b"ls"),  # type: ignore
     UsageError, r"argv must be a non-empty list"),
    ("argv-empty", lambda sb: sb.exec([]), UsageError, r"argv must be a non-empty list"),
    ("argv-item-not-str", lambda sb: sb.exec(["echo", 3]),  # type: ignore
     UsageError, r"argv item"),
    ("argv-item-with-nul", lambda sb: sb.exec(["echo", "a\x00b"]), UsageError, r"NUL"),
    ("env-key-with-equals", lambda sb: sb.exec(["true"], env={"A=B": "1"}),
     UsageError, r"env entries"),
    ("env-key-empty", lambda sb: sb.exec(["true"], env={"": "1"}), UsageError, r"env"),
    ("env-value-not-str", lambda sb: sb.exec(["true"], env={"A": 1}),  # type: ignore
     UsageError, r"env"),
    ("cwd-outside", lambda sb: sb.exec(["true"], cwd="/etc"), UsageError, r"cwd"),
    ("stdin-is-str", lambda sb: sb.exec(["cat"], stdin="text"),  # type: ignore
     UsageError, r"stdin must be bytes"),
    ("limits-not-limits", lambda sb: sb.exec(["true"], limits={"wall_s": 1}),  # type: ignore
     UsageError, r"Limits"),
    ("write-file-str-data", lambda sb: sb.write_file("a.txt", "text"),  # type: ignore
     UsageError, r"must be bytes"),
    ("write-file-dotdot", lambda sb: sb.write_file("../escape", b"x"), UsageError, r"'\.\.'"),
    ("write-file-absolute", lambda sb: sb.write_file("/etc/cron.d/x", b"x"),
     UsageError, r"relative to the workspace"),
    ("read-file-dotdot", lambda sb: sb.read_file("../../etc/shadow"), UsageError, r"'\.\.'"),
]


@pytest.mark.parametrize("call, exc, match", [m[1:] for m in MISUSES],
                         ids=[m[0] for m in MISUSES])
def test_misuse_raises_usage_error(runner, call, exc, match):
    with pytest.raises(exc, match=match):
        runner.run(_misuse(runner, call))
    assert_pool_serves(runner)


def test_unknown_language_names_the_choices(runner):
    with pytest.raises(UnknownLanguage) as info:
        runner.run(_misuse(runner, lambda sb: run_code(sb, "x", "brainfuck")))
    message = str(info.value)
    for choice in ("python", "bash", "c", "cpp"):
        assert choice in message
    assert_pool_serves(runner)


def test_misuse_leaves_the_session_usable(runner):
    """A rejected call changes nothing: the same session runs fine right after."""
    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
            for bad in (lambda: sb.exec([]), lambda: sb.exec(["nope-nope"]),
                        lambda: run_code(sb, b"\xff"), lambda: sb.write_file("../x", b"")):
                with pytest.raises(UsageError):
                    await bad()
            return await sb.exec(["python3", "-c", "print('same session')"])
    r = runner.run(body())
    assert (r.status, r.stdout) == (ExecStatus.OK, b"same session\n"), describe(r)
    no_leaks(runner)


@pytest.mark.parametrize("cwd", ["/workspace/no-such-dir", "/workspace/a-file"],
                         ids=["missing", "not-a-directory"])
def test_cwd_that_is_not_a_directory(runner, cwd):
    """The workspace is the candidate's: a directory the caller names may be gone (the
    program deleted it last run). That is the caller's mistake (UsageError) or, like a
    shell's failed `cd`, a non-zero exit; never infra, and never a wait for the clock."""
    wall_s = load_scaled(3)  # far above a failed chdir's time, however loaded the machine

    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST.with_(wall_s=wall_s)) as sb:
            await sb.write_file("a-file", b"x")
            t = time.monotonic()
            try:  # capped, so a hang fails soon after the wall limit, not the kill grace
                r = await asyncio.wait_for(sb.exec(["/bin/pwd"], cwd=cwd), 2 * wall_s)
            except UsageError as e:
                assert "cwd" in str(e) or cwd in str(e), e
                r = None
            except TimeoutError:
                pytest.fail(f"exec with cwd={cwd!r} hung (no result after {2 * wall_s:.1f} s, "
                            f"wall_s={wall_s:.1f})")
            elapsed = time.monotonic() - t
            after = await sb.exec(["/bin/pwd"])
            return r, elapsed, after
    r, elapsed, after = runner.run(body())
    if r is not None:
        assert r.status is ExecStatus.EXIT and r.exit_code, describe(r)
    # answered before its wall limit could answer (status timeout, or a late refusal)
    assert elapsed < wall_s, f"took {elapsed:.1f} s, wall_s={wall_s:.1f}"
    assert (after.status, after.stdout) == (ExecStatus.OK, b"/workspace\n"), describe(after)
    assert_pool_serves(runner)


def test_cwd_escaping_the_workspace_with_dotdot(runner):
    with pytest.raises(UsageError, match=r"cwd"):
        runner.run(_misuse(runner, lambda sb: sb.exec(["/bin/pwd"], cwd="/workspace/../etc")))
    assert_pool_serves(runner)


# ------------------------------------------------------------------ opening sessions


def test_unknown_tier(runner):
    with pytest.raises(UsageError, match=r"'docker'.*namespace"):
        runner.run(open_sandbox("docker", pool=runner.pool))
    assert_pool_serves(runner)


def test_open_sandbox_with_limits_of_wrong_type(runner):
    with pytest.raises(UsageError, match=r"Limits"):
        runner.run(open_sandbox(limits={"wall_s": 1}, pool=runner.pool))  # type: ignore
    assert_pool_serves(runner)


def test_namespace_open_with_limits_of_wrong_type(runner):
    with pytest.raises(UsageError, match=r"Limits"):
        runner.run(NamespaceSandbox.open(runner.pool, {"wall_s": 1}))  # type: ignore
    assert_pool_serves(runner)


def test_an_argv_too_large_to_send_is_a_clear_usage_error(runner):
    """argv and env travel to the cell in one datagram; past the limit the caller gets
    a UsageError that says what to do (not an `infra` failure), and the session goes on
    working. Just under it, the run works."""
    from trialbox.sandbox.namespace import SPEC_MAX

    async def body():
        async with await NamespaceSandbox.open(runner.pool, FAST) as sb:
            with pytest.raises(UsageError, match="write the program or its data to a file"):
                await sb.exec(["python3", "-c", "pass", "x" * SPEC_MAX])
            with pytest.raises(UsageError, match="at most"):
                await sb.exec(["python3", "-c", "pass"], env={"BIG": "é" * (SPEC_MAX // 2)})
            near = "#" * (SPEC_MAX - 2000)
            return await sb.exec(["python3", "-c", f"print(7){near}"])
    r = runner.run(body())
    assert r.status is ExecStatus.OK and r.stdout == b"7\n", describe(r)
    no_leaks(runner)
