"""The judge's logic above the sandbox interface, on `FakeProvider`: `grade()` picks the
grader by task kind; the function judge's orchestration (fresh candidate session, the
harness's report taken only with its nonce, the control before an exclusion, retries,
no leaked sessions); the provider capability it needs. The fake runs nothing: its
handler plays the candidate's stub and the trusted harness (harness_program's report
line), so each test decides exactly what the machinery "saw". The real judge runs on the
real tiers in the other files of this directory."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from trialbox.errors import SandboxStartError, SandboxUnavailable, UsageError
from trialbox.judge.grade import grade
from trialbox.judge.reward import RewardSpec, reward
from trialbox.judge.retry import SELF_INFLICTED
from trialbox.sandbox.fake import FakeProvider
from trialbox.types import ExecResult, ExecStatus, Limits, Outcome, Task, TaskKind, TestCase

TASK = Task("T/0", TaskKind.FUNCTION, prompt="def f(x):\n", entry_point="f",
            canonical_solution="    return x\n",
            visible_tests=(TestCase("v0", "assert candidate(1) == 1"),),
            hidden_tests=(TestCase("h0", "assert candidate(2) == 2"),))

REFERENCE, WRONG, BREAKS = "    return x\n", "    return 0\n", "    return 'infra'\n"


class FakeJudge:
    """A handler for FakeProvider playing both sides of a function judgement.

    The candidate's run (the stub) is INFRA when its solution contains `'infra'` (or
    always, with `broken=True`); the harness answers, with the nonce it was given on
    stdin, that every test passed exactly when the candidate ran the reference body."""

    def __init__(self, broken: bool = False, nonce_ok: bool = True):
        self.broken, self.nonce_ok = broken, nonce_ok
        self.solutions: asyncio.Queue[str] = asyncio.Queue()
        self.ran: list[str] = []

    async def __call__(self, argv: list[str], stdin: bytes,
                       files: dict[str, bytes]) -> ExecResult:
        code = argv[2] if len(argv) > 2 else ""
        if "_trialbox_stub" in code:
            solution = files["solution.py"].decode()
            self.ran.append(solution)
            await self.solutions.put(solution)
            if self.broken or "'infra'" in solution:
                return ExecResult(ExecStatus.INFRA, message="cell died", tier="fake")
            return ExecResult(ExecStatus.OK, exit_code=0, tier="fake")
        if "_trialbox_harness" in code:
            job = json.loads(files["job.json"])
            solution = await self.solutions.get()
            ok = solution.endswith(REFERENCE) and "'infra'" not in solution
            nonce = stdin.decode() if self.nonce_ok else "forged"
            report: dict[str, Any] = {
                "nonce": nonce, "load": "", "setup_error": "",
                "results": [{"name": t["name"], "passed": ok, "ms": 1.0,
                             "message": "" if ok else "assertion failed"}
                            for t in job["tests"]]}
            return ExecResult(ExecStatus.OK, exit_code=0, tier="fake",
                              stdout=json.dumps(report).encode() + b"\n")
        return ExecResult(ExecStatus.OK, exit_code=0, tier="fake")


def judged(completion: str, **fake: Any) -> tuple[Any, FakeJudge, FakeProvider]:
    handler = FakeJudge(**fake)
    provider = FakeProvider(handler)
    g = asyncio.run(grade(TASK, completion, provider))
    assert provider.opened and all(sb.closed for sb in provider.opened)  # nothing leaks
    return g, handler, provider


def test_a_pass_is_the_harness_report_carrying_the_nonce():
    g, h, provider = judged(REFERENCE)
    assert g.outcome is Outcome.PASSED and g.attempts == 1, g
    assert [t.name for t in g.tests] == ["h0", "v0"] and [t.hidden for t in g.tests] == \
        [True, False]
    assert len(provider.opened) == 2  # a fresh candidate session and a harness session
    cand = provider.opened[0]
    assert cand.files["solution.py"] == (TASK.prompt + REFERENCE).encode()
    # no judge pool: the stub and codec are written in, not taken from a preload
    assert {"_trialbox_stub.py", "_trialbox_codec.py"} <= set(cand.files)
    assert "job.json" not in cand.files  # test code never enters the candidate's session


def test_a_report_without_our_nonce_is_never_a_pass():
    g, _h, _p = judged(REFERENCE, nonce_ok=False)
    assert g.outcome is not Outcome.PASSED and reward(g, RewardSpec()) != 1.0, g


def test_a_wrong_answer_fails_without_retry_or_control():
    g, h, _p = judged(WRONG)
    assert (g.outcome, g.attempts) == (Outcome.FAILED, 1)
    assert h.ran == [TASK.prompt + WRONG]  # no control ran


def test_infra_the_candidate_caused_is_its_failure_proven_by_the_control():
    """The candidate's session broke, the reference passed on the same machinery: the
    candidate's doing — FAILED, reward 0, no second try."""
    g, h, _p = judged(BREAKS)
    assert g.outcome is Outcome.FAILED and SELF_INFLICTED in g.flags, g
    assert g.attempts == 1 and "the reference solution: passed" in g.message
    assert h.ran == [TASK.prompt + BREAKS, TASK.prompt + REFERENCE]
    assert reward(g, RewardSpec()) == 0.0


def test_infra_with_a_failing_control_is_retried_then_excluded():
    g, h, _p = judged(WRONG, broken=True)
    assert g.outcome is Outcome.INFRA and g.attempts == 3, g  # 1 + JudgeConfig.retries
    assert reward(g, RewardSpec()) is None and SELF_INFLICTED not in g.flags
    assert h.ran.count(TASK.prompt + WRONG) == 3 and h.ran.count(TASK.prompt + REFERENCE) == 3


def test_a_flag_is_no_verdict_the_run_decides():
    """Source that trips a detector (an exit call, never reached) is run like any other
    — none is scored unrun — and the run decides: the correct one passes with the flag
    recorded (notable), reward 1; a flagged one that breaks its session goes to the
    control like any other and is its own failure (reward 0), never excluded."""
    guarded = "    import os\n    if x is None:\n        os._exit(0)\n" + REFERENCE
    g, h, _p = judged(guarded)
    assert g.outcome is Outcome.PASSED and "exit-call" in g.flags, g
    assert reward(g, RewardSpec()) == 1.0 and h.ran == [TASK.prompt + guarded]
    g, h, _p = judged("    import os\n    os._exit(0)\n" + BREAKS)
    assert g.outcome is Outcome.FAILED and {"exit-call", SELF_INFLICTED} <= set(g.flags), g
    assert "the reference solution: passed" in g.message and reward(g, RewardSpec()) == 0.0


# -- grade(): one entry point, the grader chosen by kind ------------------------------

def commands(task: Task, answer: Any, **kw: Any) -> list[list[str]]:
    provider = FakeProvider(FakeJudge())
    asyncio.run(grade(task, answer, provider, **kw))
    return [c for sb in provider.opened for c in sb.calls]


def test_grade_chooses_the_grader_by_task_kind():
    assert any("_trialbox_harness" in " ".join(c) for c in commands(TASK, REFERENCE))
    stdio = Task("S/0", TaskKind.STDIO, prompt="echo", canonical_solution="print(input())\n",
                 visible_tests=(TestCase("t0", stdin=b"hi\n", expected=b"hi\n"),))
    ran = commands(stdio, "print(input())\n")
    assert ran and all(c[:2] == ["python3", "main.py"] for c in ran), ran
    ran = commands(stdio, "echo hi\n", language="bash")
    assert ["/bin/bash", "main.sh"] in ran, ran
    repo = Task("R/0", TaskKind.REPO, prompt="fix it", files=(("m.py", b"x = 1\n"),),
                test_files=(("test_m.py", b"def test_x():\n    assert True\n"),))
    ran = commands(repo, {"m.py": "x = 2\n"})
    assert any("_trialbox_pytest" in " ".join(c) for c in ran), ran


def test_grade_refuses_an_answer_of_the_wrong_shape():
    with pytest.raises(UsageError, match="function task's answer is the completion"):
        asyncio.run(grade(TASK, {"a.py": "x"}, FakeProvider()))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="Task"):
        asyncio.run(grade("T/0", "x", FakeProvider()))  # type: ignore[arg-type]


@pytest.mark.parametrize("task,answer", [
    (TASK, "    return x  # \ud800\n"),
    (Task("S/0", TaskKind.STDIO, "echo"), "print(input())  # \udfff"),
    (Task("R/0", TaskKind.REPO, prompt="fix it", files=(("m.py", b"x = 1\n"),)),
     {"m.py": "x = '\ud800'\n"}),
])
def test_an_answer_that_is_not_text_fails_as_its_own_answer(task, answer):
    """A lone surrogate cannot be written as UTF-8: the answer fails, graded with the
    reason — never an exception (it lost a whole eval before) and never an exclusion."""
    g = asyncio.run(grade(task, answer, FakeProvider()))
    assert g.outcome is Outcome.FAILED and "lone surrogate" in g.message, g
    assert reward(g, RewardSpec()) == 0.0


class _Refusing(FakeProvider):
    def __init__(self, error: Exception):
        super().__init__(FakeJudge())
        self.error = error

    async def open(self, limits: Limits | None = None) -> Any:
        raise self.error


def test_a_sandbox_that_cannot_be_had_is_infra_but_a_missing_tier_is_raised():
    g = asyncio.run(grade(TASK, WRONG, _Refusing(SandboxStartError("no cells"))))
    assert g.outcome is Outcome.INFRA and "no cells" in g.message
    assert reward(g, RewardSpec()) is None
    with pytest.raises(SandboxUnavailable, match="runsc"):
        asyncio.run(grade(TASK, WRONG, _Refusing(SandboxUnavailable("runsc missing"))))


def test_a_provider_that_cannot_pass_fds_is_refused_naming_its_tier():
    provider = FakeProvider(FakeJudge(), passes_fds=False)
    with pytest.raises(SandboxUnavailable, match="the fake tier's provider cannot"):
        asyncio.run(grade(TASK, REFERENCE, provider))
    assert provider.opened == []
