"""The function judge on the other isolation tiers, for real: `trialbox eval --tier gvisor`
and `--tier container` get their provider from `judge_provider` (sandbox/tiers.py's
router), and a handful of HumanEval canonical solutions pass there while exploits from
the bench's catalogue do not — the candidate and the trusted harness in two sandboxes of
that tier and the trusted harness on the namespace tier (judge/provider.py's
SplitProvider), joined by a socketpair passed in as fd 3. (All 164 on every tier:
scripts/eval-tiers.sh; too long for `make test`.)

A tier is skipped only when `trialbox doctor` says this node cannot run it."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator

import pytest

from trialbox.bench.humaneval_mix import exploit_completion
from trialbox.errors import SandboxUnavailable
from trialbox.judge.evaluate import evaluate
from trialbox.judge.function import JudgeConfig, open_harness
from trialbox.judge.provider import harness_provider, judge_provider
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.doctor import check_container, check_gvisor
from trialbox.store.tasks import index, load_tasks
from trialbox.types import Task, TaskKind, TestCase

CANONICAL = ("HumanEval/0", "HumanEval/2", "HumanEval/38", "HumanEval/53", "HumanEval/162")
"""Plain ones, one with a prompt helper the harness needs (38: encode_cyclic), and one
that imports a module (162: hashlib)."""
EXPLOITS = (("HumanEval/0", "exit0-import"), ("HumanEval/2", "always-equal"),
            ("HumanEval/53", "monkeypatch"), ("HumanEval/162", "frame-walk"))


def doctor_says_unavailable(tier: str) -> str:
    """Why `trialbox doctor` says this node cannot run `tier`, or "" when it can."""
    check = check_gvisor() if tier == "gvisor" else check_container("runc")
    report = asyncio.run(check)
    return "" if report.ok else (f"trialbox doctor: the {tier} tier is unavailable here: "
                                 f"{report.reason} (fix: {report.fix})")


class TierRunner:
    def __init__(self, tier: str) -> None:
        self.tier = tier
        self.loop = asyncio.new_event_loop()
        self.cm = judge_provider(tier, warm=2)
        try:
            self.provider: SandboxProvider = self.run(self.cm.__aenter__())
        except SandboxUnavailable:
            self.loop.close()
            why = doctor_says_unavailable(tier)
            if why:
                pytest.skip(why)
            raise

    def run(self, coro: object, timeout: float = 300) -> object:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]

    def close(self) -> None:
        self.run(self.cm.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module", params=["gvisor", "container"])
def tier(request: pytest.FixtureRequest) -> Iterator[TierRunner]:
    r = TierRunner(request.param)
    yield r
    r.close()


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return index(load_tasks("humaneval"))


def test_canonical_solutions_pass_and_exploits_do_not(tier: TierRunner,
                                                      tasks: dict[str, Task]) -> None:
    assert tier.provider.tier == tier.tier
    samples: list[dict[str, str] | str] = [
        {"task_id": t, "completion": tasks[t].canonical_solution} for t in CANONICAL]
    samples += [{"task_id": t, "completion": exploit_completion(name, tasks[t])}
                for t, name in EXPLOITS]
    # The exploits run like every attempt: the machinery of this tier must fail them by
    # itself; their flags are recorded (notable), never a verdict.
    rows, summary = tier.run(evaluate(tasks, samples, tier.provider, workers=2,
                                      config=JudgeConfig()))
    rows = [r.to_dict() for r in rows]
    assert isinstance(rows, list)
    canon, exploits = rows[:len(CANONICAL)], rows[len(CANONICAL):]
    assert [r["outcome"] for r in canon] == ["passed"] * len(CANONICAL), \
        [(r["task_id"], r["outcome"], r["message"][:300]) for r in canon]
    assert all(r["tests"] and all(t["passed"] for t in r["tests"]) for r in canon)
    for r, (_t, name) in zip(exploits, EXPLOITS, strict=True):
        assert not r["passed"] and r["reward"] == 0.0, (name, r["outcome"], r["message"])
        assert r["outcome"] not in ("infra", "error") and r["flags"], (
            name, r["outcome"], r["flags"], r["message"][:300])
        assert not r["tests"] or not all(t["passed"] for t in r["tests"]), (name, r["tests"])


def test_the_harness_runs_on_the_namespace_tier_and_the_candidate_in_the_tier(
        tier: TierRunner) -> None:
    """Asked from inside: the candidate's function returns the kernel release its
    process sees, and the trusted test checks it against the one the harness's process
    sees. Under gVisor the candidate sees gVisor's (4.4.0) and the harness, on the
    namespace tier, the host's: one gVisor run per attempt, not two. (Fails with the
    harness in gVisor too: it would see 4.4.0.)"""
    import os
    provider = tier.provider
    assert provider.tier == tier.tier and harness_provider(provider).tier == "namespace"
    harness = tier.run(open_harness(provider))
    assert harness.tier == "namespace"  # type: ignore[attr-defined]
    tier.run(harness.close())  # type: ignore[attr-defined]
    host = os.uname().release
    assert host != "4.4.0"
    candidate_sees = "4.4.0" if tier.tier == "gvisor" else host
    task = Task("where/0", TaskKind.FUNCTION, "import os\n\n\ndef kernel():\n",
                entry_point="kernel", canonical_solution="    return os.uname().release\n",
                test_setup="import os",
                hidden_tests=(TestCase("candidate", f"assert candidate() == {candidate_sees!r}"),
                              TestCase("harness", f"assert os.uname().release == {host!r}")))
    samples: list[dict[str, str] | str] = [
        {"task_id": task.task_id, "completion": task.canonical_solution},
        {"task_id": task.task_id, "completion": "    return 'elsewhere'\n"}]
    rows, _summary = tier.run(evaluate({task.task_id: task}, samples, provider, workers=1))
    passed, wrong = rows  # type: ignore[misc]
    assert passed.outcome.value == "passed", (passed.message, passed.tests)
    assert wrong.outcome.value == "failed" and [t.passed for t in wrong.tests] == [
        False, True], wrong.tests


def test_eval_cli_judges_in_the_tier_asked_and_refuses_a_weaker_one(tmp_path, capsys,
                                                                     tasks) -> None:
    """`trialbox eval --tier container` judges there; a hostile task (gvisor by the
    default policy) is refused under --tier container, and judged under --tier gvisor."""
    import json

    from trialbox.cli import main
    t = tasks["HumanEval/0"]
    row = {"task_id": t.task_id, "prompt": t.prompt, "entry_point": t.entry_point,
           "canonical_solution": t.canonical_solution, "risk": "hostile",
           "test": "def check(candidate):\n" + textwrap.indent(
               "\n".join([t.test_setup, *(c.code for c in t.hidden_tests)]), "    ")}
    (tmp_path / "set.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "s.jsonl").write_text(
        json.dumps({"task_id": t.task_id, "completion": t.canonical_solution}) + "\n"
        + json.dumps({"task_id": t.task_id, "completion": "    return False\n"}) + "\n")
    args = ["eval", "--tasks", str(tmp_path / "set.jsonl"), "--samples",
            str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "o.jsonl"), "--workers", "1"]
    rc = main([*args, "--tier", "container"])
    err = capsys.readouterr().err
    assert rc == 3 and not (tmp_path / "o.jsonl").exists(), err
    assert "pass --tier gvisor" in err and "never runs it in a weaker tier" in err, err
    rc = main([*args, "--tier", "gvisor"])
    out, err = capsys.readouterr()
    if rc == 3 and (why := doctor_says_unavailable("gvisor")):
        pytest.skip(why)
    assert rc == 0, err
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in rows] == ["passed", "failed"], rows
    assert json.loads(out.splitlines()[-1])["pass@1"] == 0.5


def test_the_split_ab_bench_runs_both_sides_with_the_same_verdicts(capsys) -> None:
    """`python -m trialbox.bench.humaneval_split`, tiny: both sides judge the same
    samples alike, the harness on namespace in one and in gVisor in the other."""
    import json

    from trialbox.bench.humaneval_split import main
    if why := doctor_says_unavailable("gvisor"):
        pytest.skip(why)
    assert main(["--rounds", "1", "--limit", "2", "--workers", "2"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["split_harness_tier"] == "namespace" and out["unsplit_harness_tier"] == "gvisor"
    assert out["same_verdicts"] and out["samples"] == 6
    assert [r["right"] for s in ("split", "unsplit") for r in out["rounds"][s]] == [6, 6]
