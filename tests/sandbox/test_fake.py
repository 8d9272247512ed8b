"""FakeSandbox honours the Sandbox interface, so upper layers can test against it."""

import asyncio

import pytest

from trialbox.errors import UnknownLanguage, UsageError
from trialbox.sandbox import Sandbox, run_code
from trialbox.sandbox.fake import FakeSandbox
from trialbox.types import ExecResult, ExecStatus


def test_fake_is_a_sandbox_and_runs_code_through_its_handler():
    async def handler(argv, stdin, files):
        return ExecResult(ExecStatus.OK, exit_code=0, stdout=files["main.py"] + stdin)

    async def body():
        async with FakeSandbox(handler) as sb:
            assert isinstance(sb, Sandbox)
            r = await run_code(sb, "print(1)", stdin=b"!")
            assert r.stdout == b"print(1)!"
            assert sb.calls == [["python3", "main.py"]]
            with pytest.raises(UnknownLanguage):
                await run_code(sb, "x", "cobol")
            with pytest.raises(UsageError):
                await sb.write_file("../escape", b"x")
        with pytest.raises(UsageError):
            await sb.exec(["true"])
    asyncio.run(body())


def test_fake_provider_is_a_provider_and_hands_out_fresh_sessions():
    from trialbox.sandbox.base import SandboxProvider
    from trialbox.sandbox.fake import FakeProvider
    from trialbox.types import Limits

    async def body():
        provider = FakeProvider()
        assert isinstance(provider, SandboxProvider)
        a = await provider.open(Limits(wall_s=2))
        b = await provider.open()
        assert a is not b and provider.opened == [a, b]
        assert a.limits.wall_s == 2 and b.limits == Limits()
        await a.write_file("x", b"1")
        assert await b.list_files() == []          # sessions share nothing
        with pytest.raises(UsageError, match="Limits"):
            await provider.open({"wall_s": 2})     # type: ignore[arg-type]
    asyncio.run(body())
