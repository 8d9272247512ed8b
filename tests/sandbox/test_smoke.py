from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.types import ExecStatus


def test_hello(runner):
    async def go():
        async with await NamespaceSandbox.open(runner.pool) as sb:
            return await run_code(sb, "print('hello', 6 * 7)")
    r = runner.run(go())
    assert r.status is ExecStatus.OK, r
    assert r.stdout == b"hello 42\n"
    assert r.runtime.startswith("python3")
    runner.assert_no_leaks()
