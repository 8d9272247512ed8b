"""Stdio judging in real sandboxes: right programs pass under every comparison mode, wrong
ones, crashes and loops fail, probes fail by their output (flagged), a broken checker is
excluded, and `trialbox eval` grades stdio samples end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from trialbox.errors import UnknownLanguage, UsageError
from trialbox.judge.evaluate import reward_of
from tests.adversarial.test_d_containment import SELF_INCLUDE
from trialbox.judge.stdio import (
    COMPILE_FLOOR_S,
    StdioJudgeConfig,
    compare_output,
    judge_stdio,
)
from trialbox.sandbox import languages
from trialbox.types import Compare, Limits, Outcome, Task, TaskKind, TestCase

FAST = StdioJudgeConfig(limits=Limits(wall_s=2, cpu_s=1, memory_mb=128, disk_mb=16))


def stdio_task(task_id: str, tests: list[tuple[str, str]], visible: int = 1,
               **kw: object) -> Task:
    cases = [TestCase(f"test_{i}", stdin=i_.encode(), expected=o.encode())
             for i, (i_, o) in enumerate(tests)]
    return Task(task_id, TaskKind.STDIO, prompt=task_id, visible_tests=tuple(cases[:visible]),
                hidden_tests=tuple(cases[visible:]), **kw)  # type: ignore[arg-type]


SUM = stdio_task("sum", [("1 2\n", "3\n"), ("5 5\n", "10\n"), ("-4 4\n", "0\n")])
REVERSE = stdio_task("reverse", [("a\nb\nc\n", "c b a"), ("x\n", "x\n")],
                     compare=Compare.WHITESPACE)
MEAN = stdio_task("mean", [("1 2\n", "1.5\n"), ("1 1 2\n", "1.3333333333\n")],
                  compare=Compare.FLOAT, float_tol=1e-6)
PERMUTE = stdio_task("permute", [("3\n", "1 2 3\n"), ("1\n", "1\n")],
                     compare=Compare.CHECKER, checker=(
                         "import sys\n"
                         "n = int(open(sys.argv[1]).read())\n"
                         "got = open(sys.argv[3]).read().split()\n"
                         "sys.exit(0 if sorted(map(int, got)) == list(range(1, n + 1)) "
                         "else 1)\n"))

SUM_PY = "a, b = map(int, input().split())\nprint(a + b)\n"
SUM_C = ("#include <stdio.h>\nint main(void){long a,b;"
         "if(scanf(\"%ld %ld\",&a,&b)!=2)return 1;printf(\"%ld\\n\",a+b);return 0;}\n")


def judge(runner, task, source, language="python", config=FAST):
    return runner.run(judge_stdio(task, source, runner.pool, config, language))


@pytest.mark.parametrize("task,source", [
    (SUM, SUM_PY),
    (REVERSE, "import sys\nprint(*reversed(sys.stdin.read().split()))\n"),
    (MEAN, "xs = list(map(int, input().split()))\nprint(f'{sum(xs) / len(xs):.9f}')\n"),
    (PERMUTE, "n = int(input())\nprint(*range(n, 0, -1))\n"),
], ids=["exact", "whitespace", "float", "checker"])
def test_correct_python_programs_pass(runner, task, source):
    g = judge(runner, task, source)
    assert g.outcome is Outcome.PASSED, g.message
    assert [t.hidden for t in g.tests] == [True] * (len(g.tests) - 1) + [False]
    assert all(t.passed for t in g.tests) and g.flags == ()
    assert g.candidate_cpu_ms > 0 and g.candidate_peak_memory_bytes > 0
    assert reward_of(g) == 1.0


def test_c_program_passes_and_a_compile_error_fails_with_the_compilers_message(runner):
    assert judge(runner, SUM, SUM_C, "c").outcome is Outcome.PASSED
    g = judge(runner, SUM, "int main(void) { return undefined_name; }\n", "c")
    assert g.outcome is Outcome.FAILED and "compilation failed" in g.message
    assert "undefined_name" in g.message
    assert len(g.tests) == 3 and not any(t.passed for t in g.tests)


CONTEST = StdioJudgeConfig(limits=Limits(wall_s=1, cpu_s=1, memory_mb=256, disk_mb=64))
"""A contest's per-test limit: 1 s."""
SUM_SOURCES = {
    # <bits/stdc++.h> alone is 1-2 s of g++'s CPU: more than a test's 1 s
    "cpp": "#include <bits/stdc++.h>\nint main(){long a,b;std::cin>>a>>b;"
           "std::cout<<a+b<<'\\n';}\n",
    # the file must be Sum.java; the JVM needs its thread floor (run_pids)
    "java": "import java.util.*;\npublic class Sum { public static void main(String[] a) {"
            " Scanner s = new Scanner(System.in);"
            " System.out.println(s.nextLong() + s.nextLong()); } }\n",
}


@pytest.mark.parametrize("language", sorted(SUM_SOURCES))
def test_compiled_programs_pass_under_a_contests_per_test_limit(runner, language):
    """The compile has a budget of its own (COMPILE_FLOOR_S), and the program is built
    and run as `run_code` does it (file and class name, env, the runtime's floors).
    Before: g++ got the test's 1 s and timed out — a right answer graded `failed` —
    and a Java program whose public class is not `Main` failed to compile."""
    if language not in languages.offered():
        pytest.fail(f"{language} is not installed: run scripts/setup-system.sh")
    g = judge(runner, SUM, SUM_SOURCES[language], language, CONTEST)
    assert g.outcome is Outcome.PASSED, g.message
    spec = languages.language(language)
    assert CONTEST.compile_limits_of(spec).wall_s == COMPILE_FLOOR_S
    assert CONTEST.compile_limits_of(spec).memory_mb >= 256


def test_a_compile_past_its_own_budget_is_the_candidates_timeout(runner):
    """An explicit compile budget holds: a self-including file (gcc would work for
    years) is `compilation failed (timeout`, failed — the candidate's, not excluded."""
    config = replace(FAST, compile_limits=Limits(wall_s=2, cpu_s=2, memory_mb=256))
    g = judge(runner, SUM, SELF_INCLUDE, "c", config)
    assert g.outcome is Outcome.FAILED, g.message
    assert "compilation failed (timeout" in g.message or (
        "compilation failed (memory" in g.message), g.message
    # that budget ended it (not COMPILE_FLOOR_S): the message names its limit
    assert any(f"Limits.{limit})" in g.message
               for limit in ("wall_s=2", "cpu_s=2", "memory_mb=256")), g.message
    with pytest.raises(UsageError, match="compile_limits"):
        StdioJudgeConfig(compile_limits=Limits(network=True))


def test_wrong_answers_fail_without_leaking_hidden_expectations(runner):
    g = judge(runner, SUM, "a, b = map(int, input().split())\nprint(a - b)\n")
    assert g.outcome is Outcome.FAILED and reward_of(g) == 0.0
    hidden, visible = g.tests[:2], g.tests[2]
    assert not any(t.passed for t in g.tests)
    assert all("wrong answer" in t.message and "10" not in t.message for t in hidden)
    assert "expected b'3\\n'" in visible.message  # visible tests may show the answer
    # whitespace and float modes still fail real differences
    assert judge(runner, MEAN, "print(1.5)").outcome is Outcome.FAILED
    assert judge(runner, PERMUTE, "print(1, 1, 2)").outcome is Outcome.FAILED


def test_infinite_loop_times_out_and_the_rest_are_not_run(runner):
    g = judge(runner, SUM, "while True:\n    pass\n")
    assert g.outcome is Outcome.TIMEOUT
    assert g.tests[0].message.startswith("timeout")
    assert all(t.message.startswith("not run") for t in g.tests[1:])


@pytest.mark.parametrize("source,outcome,message", [
    ("x = bytearray(10**9)\n", Outcome.MEMORY, "memory"),
    ("while True:\n    print('y' * 4096)\n", Outcome.FAILED, "output limit"),
    ("import os\nos.kill(os.getpid(), 11)\n", Outcome.FAILED, "crashed"),
], ids=["memory", "output", "signal"])
def test_limits_and_crashes_fail_with_their_reason(runner, source, outcome, message):
    g = judge(runner, SUM, source)
    assert g.outcome is outcome and all(t.message.startswith(message) for t in g.tests)
    runner.assert_no_leaks()


def test_right_output_then_non_zero_exit_fails(runner):
    g = judge(runner, SUM, SUM_PY + "import sys\nsys.exit(3)\n")
    assert g.outcome is Outcome.FAILED and g.flags == ()  # exiting is no cheat here
    assert "exited with status 3 (its output was correct)" in g.tests[0].message


def test_runner_text_on_stderr_does_not_pass(runner):
    g = judge(runner, SUM, "import sys\nprint('All tests passed', file=sys.stderr)\n"
                           "print(0)\n")
    assert g.outcome is Outcome.FAILED and reward_of(g) == 0.0
    assert "test-runner-output" in g.flags  # notable: stderr is never evidence


@pytest.mark.parametrize("source,detector", [
    ("print(open('/proc/self/status').read()[:0] + '3')\n", "fs-probe"),
    ("import sys\nf = sys._getframe(0)\nprint(f.f_back)\n", "frame-walk"),
], ids=["proc", "frames"])
def test_probes_and_frame_walks_fail_by_their_output(runner, source, detector):
    """A probe cannot reach stdout's comparison, made outside the sandbox: the wrong
    output fails (reward 0), the detector is recorded as notable (the correct code of
    the same shape passes: tests/judge/test_evidence.py)."""
    g = judge(runner, SUM, source)
    assert g.outcome is Outcome.FAILED and detector in g.flags, g
    assert reward_of(g) == 0.0


def test_broken_checker_is_an_error_excluded_from_reward(runner):
    broken = Task("broken", TaskKind.STDIO, "p", hidden_tests=PERMUTE.hidden_tests,
                  compare=Compare.CHECKER, checker="import sys\nsys.argv[9]\n")
    g = judge(runner, broken, "print(1, 2, 3)")
    assert g.outcome is Outcome.ERROR and reward_of(g) is None
    assert "checker is broken" in g.message and "IndexError" in g.message
    # A checker that crashes only on this output: the output's fault, not the task's.
    fussy = Task("fussy", TaskKind.STDIO, "p", hidden_tests=PERMUTE.hidden_tests,
                 compare=Compare.CHECKER, checker=PERMUTE.checker)
    g = judge(runner, fussy, "print('garbage')")
    assert g.outcome is Outcome.FAILED and "could not read the output" in g.message


@pytest.mark.parametrize("want,got,same", [
    # an expected integer: exact, by value, whatever the tolerance
    (b"1000000000000", b"1000000000007", False), (b"1000000", b"1000000.5", False),
    (b"0", b"0.0000001", False), (b"-3", b"3", False), (b"7", b"7.000000001", False),
    (b"5", b"+5", True), (b"5", b"005", True), (b"5", b"5.0", True), (b"12", b"1.2e1", True),
    (b"12", b"120e-1", True), (b"0", b"-0", True), (b"0", b"-0.0", True),
    (b"1000000000000", b"1e12", True), (b"0", b"0e-99999999999999999999999", True),
    (b"1", b"1e99999999999999999999999", False), (b"1" + b"0" * 5000, b"1e5000", True),
    (b"1" + b"0" * 5000, b"1" + b"0" * 4999 + b"1", False),
    # an expected decimal (a point or an exponent): within the tolerance
    (b"1.5", b"1.5000001", True), (b"1.5", b"1.51", False), (b"2.0", b"2", True),
    (b"1e3", b"1000.0000001", True), (b"1000000000000.0", b"1000000000007", True),
    (b"-0.0", b"0.0000001", True), (b".5", b"0.5", True), (b"1.", b"1", True),
    # anything else: the same bytes only
    (b"0x1A", b"26", False), (b"26", b"0x1A", False), (b"nan", b"nan", True),
    (b"nan", b"NaN", False), (b"inf", b"1e400", False), (b"1e400", b"1e401", False),
    (b"1.0", b"nan", False), (b"1.0", b"inf", False), (b"10", b"1_0", False),
    (b"1.0", b"1.0.0", False), (b"1", b"1e", False), (b"yes", b"YES", False),
])
def test_float_mode_compares_integers_exactly_and_decimals_within_the_tolerance(
        want, got, same):
    assert (compare_output(Compare.FLOAT, want, got, 1e-6) is None) is same


def test_compare_output_modes():
    assert compare_output(Compare.EXACT, b"3\n", b"3\n") is None
    assert compare_output(Compare.EXACT, b"3\n", b"3") is not None
    assert compare_output(Compare.WHITESPACE, b"1 2\n", b" 1\n2 ") is None
    assert compare_output(Compare.FLOAT, b"1000000.0", b"1000000.5", 1e-6) is None  # rel.
    assert compare_output(Compare.FLOAT, b"0.0", b"0.0000001", 1e-6) is None  # absolute
    assert compare_output(Compare.FLOAT, b"1", b"1.01", 1e-6) == "token 1 differs"
    assert compare_output(Compare.FLOAT, b"1 yes", b"1 no") is not None
    assert compare_output(Compare.FLOAT, b"10", b"1_0") is not None  # float() would take it
    assert compare_output(Compare.FLOAT, b"nan", b"nan") is None  # same token
    assert compare_output(Compare.FLOAT, b"1", b"1 2") == "wrong number of tokens (got 2)"


def test_usage_errors(runner):
    with pytest.raises(UnknownLanguage):
        judge(runner, SUM, SUM_PY, "cobol")
    with pytest.raises(UsageError):
        StdioJudgeConfig(retries=-1)
    fn = Task("f", TaskKind.FUNCTION, "def f(): pass\n", entry_point="f")
    with pytest.raises(UsageError):
        judge(runner, fn, SUM_PY)


def test_eval_cli_grades_stdio_samples(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({
        "task_id": "sum", "kind": "stdio", "prompt": "Print the sum of two ints.",
        "compare": "whitespace",
        "tests": [{"stdin": "1 2\n", "expected": "3\n", "hidden": False},
                  {"stdin": "5 5\n", "expected": "10\n"}]}) + "\n")
    samples = tmp_path / "samples.jsonl"
    rows = [{"task_id": "sum", "completion": SUM_PY},
            {"task_id": "sum", "completion": SUM_C, "language": "c"},
            {"task_id": "sum", "completion": "print(4)", "language": "python"},
            {"task_id": "sum", "completion": SUM_PY, "language": "cobol"}]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "graded.jsonl"
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "eval", "--tasks", str(tasks),
                        "--samples", str(samples), "--out", str(out), "--workers", "2"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    graded = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["outcome"] for r in graded] == ["passed", "passed", "failed", "error"]
    assert [r["reward"] for r in graded] == [1.0, 1.0, 0.0, None]
    assert "cobol" in graded[3]["message"]
    assert [t["hidden"] for t in graded[0]["tests"]] == [True, False]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["pass@1"] == round(2 / 3, 6) and summary["excluded"] == 1


def test_scaled_time_limits_follow_the_reference(runner):
    """With time_scale, each test's wall limit is K x the reference's time on it (floor
    min_time_s): a program 1 s slower than a fast reference times out, and passes
    without scaling."""
    from trialbox.judge.stdio import reference_times
    task = stdio_task("sum-ref", [("1 2\n", "3\n"), ("5 5\n", "10\n")],
                      canonical_solution=SUM_PY)
    scaled = StdioJudgeConfig(limits=FAST.limits.with_(wall_s=5), time_scale=3.0,
                              min_time_s=0.5)
    ref = runner.run(reference_times(task, runner.pool, scaled))
    assert set(ref) == {"test_0", "test_1"} and all(0 < ms < 500 for ms in ref.values())
    slow = "import time\ntime.sleep(1.0)\n" + SUM_PY
    g = runner.run(judge_stdio(task, slow, runner.pool, scaled, reference=ref))
    assert g.outcome is Outcome.TIMEOUT, g.message
    g = runner.run(judge_stdio(task, slow, runner.pool, replace(scaled, time_scale=None),
                               reference=ref))
    assert g.outcome is Outcome.PASSED, g.message


def test_limits_for_clamps_and_bad_scales_are_refused():
    config = StdioJudgeConfig(limits=Limits(wall_s=4), time_scale=10, min_time_s=0.5)
    assert config.limits_for(None) is None
    assert config.limits_for(1.0).wall_s == 0.5       # floor
    assert config.limits_for(200.0).wall_s == 2.0     # 10 x 0.2 s
    assert config.limits_for(10_000.0).wall_s == 4.0  # never above the configured limit
    assert StdioJudgeConfig().limits_for(5.0) is None  # no scale: the session's limits
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(UsageError, match="time_scale"):
            StdioJudgeConfig(time_scale=bad)
    with pytest.raises(UsageError, match="min_time_s"):
        StdioJudgeConfig(limits=Limits(wall_s=1), min_time_s=2)
