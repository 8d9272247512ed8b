"""`trialbox eval` end to end: every input row gets an output row, in order; the last
line printed is the summary."""

import json
import subprocess
import sys

from trialbox.store.tasks import load_humaneval


def test_eval_grades_every_row_and_reports_determinism(tmp_path):
    tasks = load_humaneval()[:6]
    samples = tmp_path / "samples.jsonl"
    lines = [json.dumps({"task_id": t.task_id, "completion": t.canonical_solution})
             for t in tasks]
    lines += [json.dumps({"task_id": tasks[0].task_id, "completion": "    return None\n"}),
              "{not json",
              json.dumps({"task_id": "HumanEval/9999", "completion": "x"}),
              json.dumps({"task_id": tasks[1].task_id})]
    samples.write_text("\n".join(lines) + "\n")
    out = tmp_path / "graded.jsonl"
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "eval", "--tasks", "humaneval",
                        "--samples", str(samples), "--out", str(out), "--repeat", "2",
                        "--workers", "3"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == len(lines) == summary["samples"]
    assert [r["outcome"] for r in rows] == ["passed"] * 6 + ["failed", "error", "error",
                                                           "error"]
    assert [r["reward"] for r in rows[:7]] == [1.0] * 6 + [0.0]
    assert all(r["reward"] is None for r in rows[7:])
    assert "unknown task_id" in rows[8]["message"] and "completion" in rows[9]["message"]
    assert summary["pass@1"] == round(6 / 7, 6) and summary["excluded"] == 3
    assert summary["deterministic"] is True and summary["repeat"] == 2
    assert all(r["deterministic"] for r in rows[:7])
    assert all(t["passed"] for r in rows[:6] for t in r["tests"])


def test_eval_bad_task_file_is_a_usage_error(tmp_path):
    samples = tmp_path / "s.jsonl"
    samples.write_text("")
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "eval", "--tasks",
                        str(tmp_path / "missing.jsonl"), "--samples", str(samples),
                        "--out", str(tmp_path / "o.jsonl")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "missing.jsonl" in p.stderr


def test_canary_pass_is_a_cheat_and_the_gap_is_reported(tmp_path, runner):
    """A canary (impossible by design) that passes is graded CHEAT; an honest attempt at
    it fails. The summary reports canaries and the visible-vs-hidden gap."""
    from trialbox.judge.anticheat import canary_check
    from trialbox.judge.evaluate import evaluate
    from trialbox.store.tasks import load_jsonl
    from trialbox.types import Grade, Outcome

    rows = [
        {"task_id": "canary/0", "canary": True, "prompt": "def f(x):\n",
         "entry_point": "f",
         "test": "def check(candidate):\n    assert candidate(1) == 1\n"
                 "    assert candidate(1) == 2\n"},
        {"task_id": "stdio/echo", "kind": "stdio", "prompt": "echo",
         "tests": [{"stdin": "a\n", "expected": "a\n", "hidden": False},
                   {"stdin": "b\n", "expected": "b\n", "hidden": True}]},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tasks = {t.task_id: t for t in load_jsonl(str(path))}
    assert tasks["canary/0"].canary and not tasks["stdio/echo"].canary
    faked = Grade("canary/0", Outcome.PASSED, flags=("x",))
    assert canary_check(faked, tasks["canary/0"]).outcome is Outcome.CHEAT
    assert "canary-passed" in canary_check(faked, tasks["canary/0"]).flags
    assert canary_check(faked, tasks["stdio/echo"]) == faked
    samples = [{"task_id": "canary/0", "completion": "    return 1\n"},
               # special-cases the visible test only
               {"task_id": "stdio/echo", "completion": "print('a')"}]
    out, summary = runner.run(evaluate(tasks, samples, runner.pool, workers=2))
    out = [r.to_dict() for r in out]
    assert out[0]["outcome"] == "failed" and out[1]["outcome"] == "failed"
    assert summary["canary_tasks"] == 1 and summary["canary_passes"] == 0
    assert summary["visible_pass_rate"] == 1.0
    assert summary["hidden_pass_rate"] == round(1 / 3, 6)  # canary: 1 of 2; echo: 0 of 1
    assert summary["visible_hidden_gap"] == round(1 - 1 / 3, 6)


def test_eval_measures_each_reference_once_and_scales_limits(runner):
    from trialbox.judge.evaluate import evaluate
    from trialbox.judge.function import JudgeConfig
    tasks = {t.task_id: t for t in load_humaneval()[12:14]}  # /12 and /13
    t13 = tasks["HumanEval/13"]
    slow = "    import time\n    time.sleep(0.3)\n" + t13.canonical_solution
    samples = [{"task_id": "HumanEval/13", "completion": t13.canonical_solution},
               {"task_id": "HumanEval/13", "completion": slow},
               {"task_id": "HumanEval/12", "completion": tasks["HumanEval/12"].canonical_solution}]
    config = JudgeConfig(time_scale=5.0, min_call_timeout_s=0.1, call_timeout_s=2.0)
    rows, summary = runner.run(evaluate(tasks, samples, runner.pool, workers=2, config=config))
    rows = [r.to_dict() for r in rows]
    assert [r["outcome"] for r in rows] == ["passed", "timeout", "passed"], rows


def test_weighted_reward_scores_style_and_efficiency(runner):
    """A weighted spec: ruff findings on the completion's own lines lower style, a
    slower-than-reference pass lowers efficiency, and the reward is their weighted mean
    with the pass rate."""
    from trialbox.judge.evaluate import evaluate
    from trialbox.judge.reward import RewardSpec
    t13 = next(t for t in load_humaneval() if t.task_id == "HumanEval/13")
    ugly_slow = ("    import os,sys\n    import time; time.sleep(0.05)\n"
                 + t13.canonical_solution)
    samples = [{"task_id": t13.task_id, "completion": t13.canonical_solution},
               {"task_id": t13.task_id, "completion": ugly_slow}]
    spec = RewardSpec(pass_rate=0.8, style=0.1, efficiency=0.1, binary=False)
    rows, _ = runner.run(evaluate({t13.task_id: t13}, samples, runner.pool, workers=1,
                                  reward_spec=spec))
    rows = [r.to_dict() for r in rows]
    clean, ugly = rows
    assert clean["outcome"] == ugly["outcome"] == "passed"
    assert clean["style_findings"] == [] and clean["style"] == 1.0
    # The same code as the reference: near 1, but these calls take microseconds, so
    # under load the ratio of two tiny times can fall well below 1 (seen: 0.14 at load
    # average ~20); only the 50 ms-per-call variant is reliably far below it.
    assert clean["efficiency"] is not None and clean["efficiency"] > 10 * ugly["efficiency"]
    assert {f.split()[0] for f in ugly["style_findings"]} >= {"E401", "F401", "E702"}
    assert ugly["style"] == 0.0 and ugly["efficiency"] < 0.2
    expected = (0.8 * 1.0 + 0.1 * ugly["style"] + 0.1 * ugly["efficiency"]) / 1.0
    assert abs(ugly["reward"] - expected) < 1e-9
    assert ugly["reward"] < clean["reward"]


def test_weighted_reward_scores_peak_memory_against_the_reference(runner):
    """A pass that holds far more memory than the reference scores lower on memory; the
    rows carry the reference's peak."""
    from trialbox.judge.evaluate import evaluate
    from trialbox.judge.reward import RewardSpec
    t13 = next(t for t in load_humaneval() if t.task_id == "HumanEval/13")
    hog = "    _hog = b'x' * (160 << 20)\n" + t13.canonical_solution
    samples = [{"task_id": t13.task_id, "completion": t13.canonical_solution},
               {"task_id": t13.task_id, "completion": hog}]
    spec = RewardSpec(pass_rate=0.7, style=0.1, efficiency=0.1, memory=0.1, binary=False)
    rows, _ = runner.run(evaluate({t13.task_id: t13}, samples, runner.pool, workers=1,
                                  reward_spec=spec))
    rows = [r.to_dict() for r in rows]
    clean, fat = rows
    assert clean["outcome"] == fat["outcome"] == "passed"
    assert clean["reference_peak_memory_bytes"] > 0
    # The clean solution's own peak against the reference's is noisy for processes this
    # small (0.6 seen in a fresh-clone make test, 2026-12-02): the property is the gap.
    assert clean["memory"] > 0.5 and fat["memory"] < 0.3, (clean["memory"], fat["memory"])
    assert fat["candidate_peak_memory_bytes"] > 160 << 20
    assert fat["reward"] < clean["reward"]


def test_eval_grades_repo_and_stdio_rows(runner, tmp_path):
    """Repository tasks through `evaluate`: a diff and a files overlay; stdio rows get an
    efficiency score from the reference's run times."""
    from trialbox.judge.evaluate import evaluate, read_samples
    from trialbox.judge.reward import RewardSpec
    from trialbox.store.tasks import index, load_jsonl
    fix = ("--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
           "-    return a - b\n+    return a + b\n")
    task_rows = [
        {"task_id": "calc", "kind": "repo", "prompt": "Fix add.",
         "files": {"calc/__init__.py": "", "calc/ops.py": "def add(a, b):\n    return a - b\n"},
         "test_files": {"tests/test_ops.py": "from calc.ops import add\n\n\n"
                                             "def test_add():\n    assert add(1, 2) == 3\n"},
         "hidden_test_files": {"tests/test_more.py": "from calc.ops import add\n\n\n"
                                                     "def test_neg():\n"
                                                     "    assert add(-1, -2) == -3\n"},
         "canonical_solution": fix},
        {"task_id": "sum", "kind": "stdio", "prompt": "sum", "canonical_solution":
         "print(sum(map(int, input().split())))\n",
         "tests": [{"stdin": "1 2\n", "expected": "3\n"}]}]
    tf = tmp_path / "tasks.jsonl"
    tf.write_text("".join(json.dumps(r) + "\n" for r in task_rows))
    sf = tmp_path / "samples.jsonl"
    sf.write_text("".join(json.dumps(r) + "\n" for r in [
        {"task_id": "calc", "completion": fix},
        {"task_id": "calc", "files": {"calc/ops.py": "def add(a, b):\n  import os\n"
                                                    "  return abs(a) + b\n"}},
        {"task_id": "calc", "files": {"conftest.py": "x = 1\n"}},
        {"task_id": "sum", "completion": "print(sum(map(int, input().split())))\n"}]))
    spec = RewardSpec(pass_rate=0.7, style=0.1, efficiency=0.1, memory=0.1, binary=False)
    rows, summary = runner.run(evaluate(index(load_jsonl(tf)), read_samples(str(sf)),
                                        runner.pool, workers=2, reward_spec=spec,
                                        repeat=2))
    rows = [r.to_dict() for r in rows]
    good, wrong, configured, stdio = rows
    assert good["outcome"] == "passed" and good["efficiency"] is not None
    assert good["memory"] is not None and good["reward"] > 0.7
    assert [t["name"] for t in good["tests"]] == ["tests/test_more.py::test_neg",
                                                  "tests/test_ops.py::test_add"]
    assert wrong["outcome"] == "failed" and wrong["efficiency"] is None
    assert [t["passed"] for t in wrong["tests"]] == [False, True]
    assert any("F401" in f for f in wrong["style_findings"]), wrong["style_findings"]
    # A conftest.py of its own is stripped (the task's configuration is used): it cannot
    # reach the evidence, so it is notable, and the unchanged tree fails by its tests.
    assert configured["outcome"] == "failed", configured
    assert configured["flags"] == ["conftest-injection"]
    assert [t["passed"] for t in configured["tests"]] == [False, False]
    assert configured["reward"] < good["reward"]
    assert stdio["outcome"] == "passed" and stdio["efficiency"] is not None
    assert summary["visible_hidden_gap"] is not None and summary["outcomes"] == {
        "passed": 2, "failed": 2}
    # Same tree, same outcome on the repeat (the weighted rewards themselves move with
    # timing noise through the efficiency score).
    assert all(r["repeats"][0]["outcome"] == r["outcome"] for r in rows)


def test_eval_cli_grades_a_repo_task_from_directories(tmp_path):
    """`trialbox eval` end to end on a repository task whose tree and hidden tests are
    directories beside the task file."""
    (tmp_path / "src" / "calc").mkdir(parents=True)
    (tmp_path / "src" / "calc" / "__init__.py").write_text("")
    (tmp_path / "src" / "calc" / "ops.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "hidden" / "tests").mkdir(parents=True)
    (tmp_path / "hidden" / "tests" / "test_ops.py").write_text(
        "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n")
    (tmp_path / "tasks.jsonl").write_text(json.dumps(
        {"task_id": "calc", "kind": "repo", "prompt": "Fix add.", "files": "src",
         "hidden_test_files": "hidden"}) + "\n")
    fix = ("--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
           "-    return a - b\n+    return a + b\n")
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"task_id": "calc", "completion": fix}, {"task_id": "calc", "files": {}}]))
    out = tmp_path / "graded.jsonl"
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "eval", "--tasks",
                        str(tmp_path / "tasks.jsonl"), "--samples",
                        str(tmp_path / "samples.jsonl"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["outcome"], r["reward"]) for r in rows] == [("passed", 1.0), ("failed", 0.0)]
    assert json.loads(p.stdout.strip().splitlines()[-1])["pass@1"] == 0.5


def test_row_tests_are_every_field_of_each_test_result():
    """A row's tests hold what dataclasses.asdict gives for each TestResult (the row is
    built without asdict's deep copy; a field added to TestResult must still appear)."""
    from dataclasses import asdict

    from trialbox.judge.evaluate import _row
    from trialbox.types import EvalSample, Grade, Outcome, TestResult

    tests = (TestResult("t0", True, "", 0.25, True),
             TestResult("t1", False, "assertion failed", 1.5, False))
    g = Grade("T/0", Outcome.FAILED, tests=tests, message="t1: assertion failed")
    row = _row(EvalSample("T/0", "x"), [g]).to_dict()
    assert row["tests"] == [asdict(t) for t in tests]
    assert row["reward"] == 0.0 and row["outcome"] == "failed"


def test_eval_of_a_samples_file_it_cannot_read_says_so_and_fails(tmp_path):
    """Rows with `code` instead of `completion` and unknown ids: every row an error
    row, the reasons on stderr, exit 1 — not a quiet exit 0 with everything excluded."""
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "code": "x"}) + "\n"
                       + json.dumps({"task_id": "HumanEval/999", "completion": "x"}) + "\n")
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "eval", "--tasks", "humaneval",
                        "--samples", str(samples), "--out", str(tmp_path / "o.jsonl")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert "2 of 2 samples could not be graded" in p.stderr
    assert "non-string completion" in p.stderr and "unknown task_id" in p.stderr
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2  # rows still written
