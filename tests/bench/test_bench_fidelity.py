"""Smoke test of `trialbox bench fidelity`: two HumanEval tasks and one demo task, four
completions each, run as the CLI runs it (a child process: it starts its own pool); the
table, the JSON and the exit status (1 exactly when a disagreement is listed) agree."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = ("import sys\n"
         "from trialbox.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")


def test_bench_fidelity_smoke(tmp_path) -> None:
    out = tmp_path / "fidelity.json"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "bench", "fidelity", "--limit", "2", "--demo-tasks",
         "1", "--variants-per-task", "4", "--seed", "3", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=240, check=False)
    lines = proc.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    assert json.loads(out.read_text()) == res
    assert proc.returncode == (0 if res["ok"] else 1), proc.stderr[-3000:]
    assert res["tasks"] == 3 and res["variants"] == 12
    assert res["correct"] + res["wrong"] == 12 and res["correct"] >= 3  # the canonicals
    assert set(res["directions"]) == {"correct-scored-0", "wrong-scored-1", "excluded"}
    assert sum(res["directions"].values()) == len(res["disagreements"])
    assert sum(c["variants"] for c in res["by_kind"].values()) == 12
    assert len(lines) == 1  # --json: the table went to stderr
    table = proc.stderr
    assert "correct per the ordinary harness" in table
    assert table.count("DISAGREEMENT ") == len(res["disagreements"])
