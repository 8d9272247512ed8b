"""Risk → tier (tiers.py): the policy's checks and the router's choice with fakes, then
the real namespace and gvisor providers, and a tier the node lacks refused, never
downgraded."""

from __future__ import annotations

import asyncio
import platform
from typing import Any

import pytest

from trialbox.errors import SandboxUnavailable, UsageError
from trialbox.sandbox.doctor import NodeReport, TierReport
from trialbox.sandbox.fake import FakeProvider
from trialbox.sandbox.gvisor import GVisorProvider
from trialbox.sandbox.oci import OciConfig
from trialbox.sandbox.tiers import TierPolicy, TierRouter, with_risk
from trialbox.types import Limits, Risk, Task, TaskKind


def _task(risk: Risk | None = None, task_id: str = "t/1") -> Task:
    if risk is None:
        return Task(task_id, TaskKind.STDIO, "p")
    return Task(task_id, TaskKind.STDIO, "p", risk=risk)


def _fake(tier: str) -> FakeProvider:
    p = FakeProvider()
    p.tier = tier  # a fake standing in for that tier's provider (routing only)
    return p


def test_default_policy_and_task_risk() -> None:
    assert _task().risk is Risk.ROUTINE
    p = TierPolicy()
    assert [p.tier_for(r) for r in Risk] == ["namespace", "gvisor", "gvisor"]
    assert p.tiers == ["namespace", "gvisor"]
    assert [t.risk for t in with_risk([_task(), _task(Risk.UNTRUSTED)], Risk.HOSTILE)] == \
        [Risk.HOSTILE, Risk.HOSTILE]


def test_policy_bad_input_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match=r"TierPolicy.untrusted='kata' is not a tier; use "
                                         r"one of namespace, container, gvisor"):
        TierPolicy(untrusted="kata")
    with pytest.raises(UsageError, match="maps hostile to 'namespace', a weaker tier than "
                                         "untrusted's 'gvisor'.*hostile='gvisor'"):
        TierPolicy(hostile="namespace")
    with pytest.raises(UsageError, match="risk must be a trialbox.types.Risk"):
        TierPolicy().tier_for("hostile")  # type: ignore[arg-type]
    TierPolicy(routine="container", untrusted="container", hostile="gvisor")  # fine


def test_router_picks_by_risk() -> None:
    ns, gv = _fake("namespace"), _fake("gvisor")
    router = TierRouter([ns, gv])
    assert router.provider_for(_task()) is ns
    assert router.provider_for(_task(Risk.UNTRUSTED)) is gv
    assert router.provider_for(Risk.HOSTILE) is gv
    with pytest.raises(UsageError, match="two providers of tier 'gvisor'"):
        TierRouter([gv, _fake("gvisor")])
    with pytest.raises(UsageError, match="is not a SandboxProvider"):
        TierRouter([object()])  # type: ignore[list-item]


def test_a_missing_tier_is_refused_never_downgraded() -> None:
    ns = _fake("namespace")
    report = NodeReport("Linux x", "v1", True, True, tiers=[
        TierReport("namespace", True),
        TierReport("gvisor", False, "runsc (gVisor) is not installed", "apt-get install runsc"),
        TierReport("container (runc)", True), TierReport("container (crun)", False, "no")])
    router = TierRouter([ns], missing=report)
    assert router.provider_for(_task()) is ns
    with pytest.raises(SandboxUnavailable) as e:
        router.provider_for(_task(Risk.HOSTILE, "evil/1"))
    msg = str(e.value)
    for part in ("task 'evil/1' is hostile", "gvisor tier", "runsc (gVisor) is not installed",
                 "apt-get install runsc", "TierPolicy(hostile=...)", "offers (namespace)",
                 "never runs it in a weaker tier"):
        assert part in msg, (part, msg)
    assert "container" not in router.missing  # runc runs, so crun's failure is no verdict
    with pytest.raises(SandboxUnavailable, match="no provider of that tier was given"):
        TierRouter([ns]).provider_for(Risk.UNTRUSTED)


def test_real_tiers_by_risk() -> None:
    """routine runs on the host kernel (namespace), hostile under gVisor's; with runsc
    missing, routine still runs and hostile is refused with the fix."""
    async def body() -> None:
        factories = {"gvisor": lambda: GVisorProvider(OciConfig(warm=0))}
        async with await TierRouter.start(TierPolicy(), factories) as router:
            kernels = {}
            for risk in (Risk.ROUTINE, Risk.HOSTILE):
                provider = router.provider_for(_task(risk))
                async with await provider.open(Limits(wall_s=20)) as sb:
                    r = await sb.exec(["uname", "-r"])
                assert r.ok and r.tier == provider.tier, r
                kernels[provider.tier] = r.stdout.decode().strip()
            assert kernels == {"namespace": platform.release(), "gvisor": "4.4.0"}
        factories = {"gvisor": lambda: GVisorProvider(OciConfig(warm=0),
                                                      runsc="/nonexistent/runsc")}
        async with await TierRouter.start(TierPolicy(), factories) as router:
            assert set(router.providers) == {"namespace"}
            async with await router.provider_for(_task()).open() as sb:
                assert (await sb.exec(["/bin/true"])).ok
            with pytest.raises(SandboxUnavailable, match="apt-get install runsc"):
                router.provider_for(_task(Risk.UNTRUSTED))

    asyncio.run(asyncio.wait_for(body(), 120))


# ------------------------------------------------------------ risk declared in task files

STDIO_ROW = ('{"task_id": "%s", "kind": "stdio", "prompt": "p", '
             '"tests": [{"stdin": "", "expected": "1\\n"}]%s}')
FUNCTION_ROW = ('{"task_id": "%s", "prompt": "def f():\\n", "entry_point": "f", '
                '"test": "def check(candidate):\\n    assert candidate() == 1\\n"%s}')


def _load(tmp_path: Any, *lines: str) -> list[Task]:
    from trialbox.store.tasks import load_tasks
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return load_tasks(str(path))


def test_task_files_declare_risk_per_task_and_per_set(tmp_path: Any) -> None:
    tasks = _load(tmp_path, STDIO_ROW % ("a", ""), STDIO_ROW % ("b", ', "risk": "hostile"'),
                  FUNCTION_ROW % ("c", ', "risk": "untrusted"'))
    assert [t.risk for t in tasks] == [Risk.ROUTINE, Risk.HOSTILE, Risk.UNTRUSTED]
    tasks = _load(tmp_path, '{"task_set": {"risk": "untrusted"}}', STDIO_ROW % ("a", ""),
                  FUNCTION_ROW % ("b", ', "risk": "hostile"'))
    assert [t.risk for t in tasks] == [Risk.UNTRUSTED, Risk.HOSTILE]
    # routed by it
    router = TierRouter([_fake("namespace"), _fake("gvisor")])
    assert [router.provider_for(t).tier for t in tasks] == ["gvisor", "gvisor"]


@pytest.mark.parametrize("lines, hint", [
    ([STDIO_ROW % ("a", ', "risk": "evil"')], "unknown risk 'evil'; use one of routine"),
    ([FUNCTION_ROW % ("a", ', "risk": 3')], "unknown risk 3"),
    (['{"task_set": {"risk": "hostile"}}', STDIO_ROW % ("a", ', "risk": "routine"')],
     "below its task set's 'hostile'"),
    ([STDIO_ROW % ("a", ""), '{"task_set": {"risk": "hostile"}}'], "must be the file's first"),
    (['{"task_set": {"level": "hostile"}}'], "unknown field 'level' in 'task_set'"),
])
def test_a_bad_risk_in_a_task_file_is_a_clear_error(tmp_path: Any, lines: list[str],
                                                    hint: str) -> None:
    with pytest.raises(UsageError, match=hint):
        _load(tmp_path, *lines)


def test_eval_refuses_a_task_whose_tier_it_cannot_run(tmp_path: Any, capsys: Any) -> None:
    """`trialbox eval` grades in the namespace tier only: a hostile task (gvisor by the
    default policy) is refused before anything runs, never graded in the weaker tier."""
    from trialbox.cli import main
    path = tmp_path / "set.jsonl"
    path.write_text(STDIO_ROW % ("a", "") + "\n" + STDIO_ROW % ("evil/1", ', "risk": "hostile"')
                    + "\n")
    (tmp_path / "s.jsonl").write_text('{"task_id": "a", "completion": "print(1)"}\n')
    rc = main(["eval", "--tasks", str(path), "--samples", str(tmp_path / "s.jsonl"),
               "--out", str(tmp_path / "o.jsonl"), "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 3 and not (tmp_path / "o.jsonl").exists(), err
    assert "task 'evil/1' is hostile" in err and "gvisor tier" in err, err
    assert "never runs it in a weaker tier" in err, err
