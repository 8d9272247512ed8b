"""`make demo` end to end. The training demo's smoke run (tiny budget: every phase runs,
through the real agent loop, judge and sandboxes; the learning itself is measured by
`make bench`), and the sandbox showcase (`trialbox demo sandbox`)."""

import json
import os
import subprocess
import sys


def test_training_demo_smoke_run(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "demo", "--smoke", "--seed",
                        "3", "--out", str(out), "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "test pass@1 before" in p.stdout and "test pass@1 after" in p.stdout
    assert "[95% CI " in p.stdout and "(paired over the same tasks)" in p.stdout
    assert "removed from the test split:" in p.stdout  # the overlap, beside the figure
    assert "GRPO step   2/2" in p.stdout and "episodes/s" in p.stdout
    assert "generation" in p.stdout and "sandboxes" in p.stdout
    assert "by template (passed/graded" in p.stdout
    assert "answers that are exactly the teacher's bug:" in p.stdout
    png = out / "reward_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in p.stdout
    steps = [json.loads(x) for x in open(out / "metrics.jsonl")]
    assert [x["step"] for x in steps if x["kind"] == "step"] == [1, 2]
    assert os.listdir(out / "tb") and (out / "final" / "config.json").exists()
    result = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    assert result["seed"] == 3 and result["steps"] == 2
    assert 0.0 <= result["pass_before"] <= 1.0 and 0.0 <= result["pass_after"] <= 1.0
    assert result["split"] == "test" and result["eval_tasks"] == 8
    lo, hi = result["ci95_after"]
    assert lo <= result["pass_after"] <= hi and len(result["rise_ci95"]) == 2


def test_sandbox_showcase_runs_clean():
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "demo", "sandbox"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "every program got the status it earned" in p.stdout
    assert "0 sandbox processes left on the host" in p.stdout
    assert "the trusted judge on HumanEval/0" in p.stdout
