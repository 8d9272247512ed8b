"""The tuning probe (scripts/grpo_probe.py) runs end to end, and its reward never
credits an output that is not a DSL program equal to the task's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trialbox.train import demo_tasks as D

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "grpo_probe.py"


def _probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_probe", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reward_credits_only_the_tasks_program() -> None:
    probe = _probe()
    for task in D.make_tasks(D.Split.TRAIN, 40, seed=3):
        right = D.solution_of(task)
        assert probe.reward(task, right) == 1.0
        assert probe.reward(task, right.strip() + "  \nrest") == 1.0  # first line only
        assert probe.reward(task, "None\n") == 0.0
        assert probe.reward(task, "__import__('os').getpid()\n") == 0.0  # never run
        wrong = D._wrong_for(D._program_of(task), task, __import__("random").Random(0))
        if wrong is not None:
            assert probe.reward(task, wrong.expr + "\n") == 0.0


@pytest.mark.slow
def test_probe_smoke_run(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sft", "3", "--steps", "2", "--tasks", "2",
         "--group", "2", "--eval-every", "2", "--eval-tasks", "4",
         "--cache", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [x["at"] for x in lines if "at" in x] == ["start", "step 2"]
    assert [x["step"] for x in lines if "step" in x] == [1, 2]
    assert all(0.0 <= x["batch_pass"] <= 1.0 for x in lines if "step" in x)
    assert any(p.name.startswith("sft3_") for p in tmp_path.iterdir())  # start cached
