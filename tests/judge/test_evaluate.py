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
