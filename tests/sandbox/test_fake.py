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
