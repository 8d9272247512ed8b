"""The function judge on the other isolation tiers, for real: `trialbox eval --tier gvisor`
and `--tier container` get their provider from `judge_provider` (sandbox/tiers.py's
router), and a handful of HumanEval canonical solutions pass there while exploits from
the bench's catalogue do not — the candidate and the trusted harness in two sandboxes of
that tier, joined by a socketpair passed in as fd 3. (All 164 on every tier:
scripts/eval-tiers.sh; too long for `make test`.)

A tier is skipped only when `trialbox doctor` says this node cannot run it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from trialbox.bench.humaneval_mix import exploit_completion
from trialbox.errors import SandboxUnavailable
from trialbox.judge.evaluate import evaluate
from trialbox.judge.function import JudgeConfig
from trialbox.judge.provider import judge_provider
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.doctor import check_container, check_gvisor
from trialbox.store.tasks import index, load_tasks
from trialbox.types import Task

CANONICAL = ("HumanEval/0", "HumanEval/2", "HumanEval/38", "HumanEval/53", "HumanEval/162")
"""Plain ones, one with a prompt helper the harness needs (38: encode_cyclic), and one
that imports a module (162: hashlib)."""
EXPLOITS = (("HumanEval/0", "exit0-import"), ("HumanEval/2", "always-equal"),
            ("HumanEval/53", "monkeypatch"), ("HumanEval/162", "frame-walk"))


class TierRunner:
    def __init__(self, tier: str) -> None:
        self.tier = tier
        self.loop = asyncio.new_event_loop()
        self.cm = judge_provider(tier, warm=2)
        try:
            self.provider: SandboxProvider = self.run(self.cm.__aenter__())
        except SandboxUnavailable:
            check = check_gvisor() if tier == "gvisor" else check_container("runc")
            report = self.run(check)
            self.loop.close()
            if not report.ok:
                pytest.skip(f"trialbox doctor: the {tier} tier is unavailable here: "
                            f"{report.reason} (fix: {report.fix})")
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
    # The exploits run (not scored from their source alone): the machinery of this tier
    # must fail them by itself; the flags still make them CHEAT.
    rows, summary = tier.run(evaluate(tasks, samples, tier.provider, workers=2,
                                      config=JudgeConfig(run_static_cheats=True)))
    assert isinstance(rows, list)
    canon, exploits = rows[:len(CANONICAL)], rows[len(CANONICAL):]
    assert [r["outcome"] for r in canon] == ["passed"] * len(CANONICAL), \
        [(r["task_id"], r["outcome"], r["message"][:300]) for r in canon]
    assert all(r["tests"] and all(t["passed"] for t in r["tests"]) for r in canon)
    for r, (_t, name) in zip(exploits, EXPLOITS, strict=True):
        assert not r["passed"] and r["reward"] == 0.0, (name, r["outcome"], r["message"])
        assert r["outcome"] == "cheat", (name, r["outcome"], r["message"][:300])
        assert not r["tests"] or not all(t["passed"] for t in r["tests"]), (name, r["tests"])
