"""The task factory for real (judge/factory.py): a tiny project's sdist, built in
tmp_path, becomes validated repository tasks on the trusted tier of the namespace
sandbox — its unstable test left out with the reason, each task's reference passing and
its starting tree failing exactly its FAIL_TO_PASS, the same files from the API and the
CLI with the same seed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.store.sdist_maker import make_sdist
from trialbox.cli import main as cli_main
from trialbox.errors import UsageError
from trialbox.judge.factory import UNSTABLE, FactoryConfig, build_pack, problem_statement
from trialbox.judge.mutate import mutation_sites
from trialbox.judge.repo import judge_repo
from trialbox.store.sdist import read_sdist
from trialbox.store.tasks import load_tasks
from trialbox.types import Outcome

OPS = '''\
def add(a, b):
    return a + b


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def count_above(xs, limit):
    n = 0
    for x in xs:
        if x > limit:
            n += 1
    return n
'''
TESTS = '''\
import unittest

from minicalc import add, clamp, count_above


def test_add():
    assert add(2, 3) == 5


def test_clamp():
    assert clamp(-5, 0, 10) == 0
    assert clamp(50, 0, 10) == 10
    assert clamp(5, 0, 10) == 5


def test_clamp_edges():
    assert clamp(0, 0, 10) == 0
    assert clamp(10, 0, 10) == 10


def test_count_above():
    assert count_above([1, 5, 7, 10], 5) == 2


class TestMore:
    def test_add_negative(self):
        assert add(-1, -1) == -2


def test_known_bug():  # fails on the unmodified project: never graded
    assert add(0.1, 0.2) == 0.3


class ClampCases(unittest.TestCase):  # collected by pytest, whatever its name
    def test_inside(self):
        self.assertEqual(clamp(3, 0, 10), 3)

    def test_wrong_expectation(self):  # fails on the unmodified project too
        self.assertEqual(clamp(3, 0, 10), 4)


class Checks:  # a mixin: its tests run (and report) only as AddCases's
    def test_add_zero(self):
        assert add(0, 0) == 0

    def test_add_wrong(self):  # fails too: renamed here, where it is defined
        assert add(1, 1) == 3


class AddCases(Checks, unittest.TestCase):
    pass
'''
FILES = {"minicalc/__init__.py": "from minicalc.ops import add, clamp, count_above\n",
         "minicalc/ops.py": OPS, "tests/test_ops.py": TESTS}
CONFIG = FactoryConfig(mutants=2, seed=3, baseline_runs=2, workers=1)
ARGS = ["--mutants", "2", "--seed", "3", "--baseline-runs", "2", "--workers", "1"]


@pytest.fixture(scope="module")
def pack(runner, tmp_path_factory):
    where = tmp_path_factory.mktemp("factory")
    sdist = make_sdist(where, "minicalc", "0.1", FILES)
    [rep] = runner.run(build_pack([sdist], where / "pack", runner.pool, CONFIG), 300)
    return sdist, where / "pack", rep


def test_tasks_are_built_and_the_unstable_test_is_left_out(pack):
    _, out, rep = pack
    manifest = json.loads((out / "manifest.json").read_text())
    [project] = manifest["projects"]
    assert project["tier"] == "trusted" and project["version"] == "0.1"
    assert project["dropped_tests"] == {
        "tests/test_ops.py::test_known_bug": "failed: assert 0.30000000000000004 == 0.3",
        "tests/test_ops.py::ClampCases::test_wrong_expectation":
            "failed: AssertionError: 3 != 4",
        "tests/test_ops.py::AddCases::test_add_wrong": "failed: assert 2 == 3"}
    assert "tests/test_ops.py::AddCases::test_add_zero" in project["graded_tests"]
    assert len(project["graded_tests"]) == 7
    assert not set(project["dropped_tests"]) & set(project["graded_tests"])
    pruned = (out / "minicalc-0.1/tests/tests/test_ops.py").read_text()
    assert f"def {UNSTABLE}test_known_bug" in pruned
    assert f"def {UNSTABLE}test_wrong_expectation" in pruned
    assert f"def {UNSTABLE}test_add_wrong" in pruned and "def test_add_zero" in pruned
    assert len(manifest["tasks"]) == 2 == len(rep.tasks)
    for entry in manifest["tasks"]:
        assert entry["mutated_files"] == ["minicalc/ops.py"] and entry["tier"] == "trusted"
        assert entry["fail_to_pass"] and entry["pass_to_pass"]
        assert sorted(entry["fail_to_pass"] + entry["pass_to_pass"]) == \
            project["graded_tests"]


def test_reference_passes_and_the_start_fails_exactly_fail_to_pass(runner, pack):
    _, out, _ = pack
    tasks = load_tasks(str(out / "tasks.jsonl"))  # the rows `trialbox eval` loads
    entries = {e["task_id"]: e for e in json.loads(
        (out / "manifest.json").read_text())["tasks"]}
    assert [t.task_id for t in tasks] == ["minicalc-0.1/000", "minicalc-0.1/001"]
    for task in tasks:
        e = entries[task.task_id]
        assert task.hidden_test_files and not task.test_files
        original = OPS.splitlines()[e["mutation"]["line"] - 1].strip()
        assert original not in task.prompt  # the prompt never shows the fix's line
        assert all(f"- {n}" in task.prompt for n in e["fail_to_pass"])
        ref = runner.run(judge_repo(task, task.canonical_solution, runner.pool,
                                    CONFIG.judge))
        assert ref.outcome is Outcome.PASSED, ref.message
        start = runner.run(judge_repo(task, {}, runner.pool, CONFIG.judge))
        assert start.outcome is Outcome.FAILED
        assert sorted(t.name for t in start.tests if not t.passed) == e["fail_to_pass"]


def test_the_cli_builds_the_same_pack_from_the_same_seed(pack, tmp_path, capsys):
    sdist, out, _ = pack
    assert cli_main(["tasks", "from-sdist", str(sdist), "--out", str(tmp_path / "again"),
                     *ARGS]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (line["project"], line["tasks"], line["graded_tests"]) == ("minicalc", 2, 7)
    for name in ("tasks.jsonl", "manifest.json", "minicalc-0.1/tests/tests/test_ops.py"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name


def test_the_prompt_never_quotes_the_original_line(tmp_path):
    sd = read_sdist(make_sdist(tmp_path, "minicalc", "0.1", FILES))
    ops = dict(sd.files)["minicalc/ops.py"]
    m = next(m for m in mutation_sites("minicalc/ops.py", ops) if m.operator == "binop")
    leaked = "E       assert add(2, 3) == 5\nE        +  return a + b"
    text = problem_statement(sd, ["tests/test_ops.py::test_add"],
                             {"tests/test_ops.py::test_add": leaked}, ops, m)
    assert "assert add(2, 3) == 5" in text and "return a + b" not in text


def test_a_project_with_no_passing_test_and_a_used_out_dir_are_refused(runner, tmp_path):
    broken = {**FILES, "tests/test_ops.py": "def test_no():\n    assert False\n"}
    sdist = make_sdist(tmp_path, "minicalc", "0.1", broken)
    with pytest.raises(UsageError, match="no test of minicalc-0.1 passes steadily on the "
                       "trusted tier.*try --tier in-process"):
        runner.run(build_pack([sdist], tmp_path / "out", runner.pool,
                              replace(CONFIG, baseline_runs=1)))
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(UsageError, match="not an empty directory"):
        runner.run(build_pack([sdist], tmp_path / "used", runner.pool, CONFIG))


@pytest.mark.bench_only
def test_real_sdists_give_validated_tasks(runner, tmp_path):
    """`make bench`: TRIALBOX_SDISTS=a.tar.gz:b.tar.gz (downloaded beforehand: nothing is
    downloaded here) — each gives >= 1 task whose reference passes and whose start fails
    exactly FAIL_TO_PASS."""
    import os
    paths = [p for p in os.environ.get("TRIALBOX_SDISTS", "").split(":") if p]
    if not paths:
        pytest.skip("set TRIALBOX_SDISTS to the paths of sdists (.tar.gz) to build")
    reps = runner.run(build_pack(paths, tmp_path / "pack", runner.pool,
                                 FactoryConfig(mutants=2)), 1800)
    assert all(r.tasks for r in reps), [(r.project, r.tried) for r in reps]
    entries = {e["task_id"]: e for e in json.loads(
        (tmp_path / "pack" / "manifest.json").read_text())["tasks"]}
    for task in load_tasks(str(tmp_path / "pack" / "tasks.jsonl")):
        judge = FactoryConfig().judge
        assert runner.run(judge_repo(task, task.canonical_solution, runner.pool, judge),
                          300).passed
        start = runner.run(judge_repo(task, {}, runner.pool, judge), 300)
        assert sorted(t.name for t in start.tests if not t.passed) == \
            entries[task.task_id]["fail_to_pass"]
