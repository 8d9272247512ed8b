"""Harbor-style task directories: loaded, checked, run and graded on the real namespace
tier — the oracle passes, wrong answers fail, what the agent plants outside /app never
reaches the verifier, a broken verifier is told apart from a wrong answer, and a task
whose environment cannot be provided is reported while the rest run."""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest

from trialbox.errors import UsageError
from trialbox.judge.harbor import judge_harbor, run_harbor
from trialbox.sandbox.pool import CellPool, PoolConfig
from trialbox.store.harbor import HarborError, load_harbor
from trialbox.types import Outcome

TOML = """\
version = "1.0"
[metadata]
difficulty = "easy"
[verifier]
timeout_sec = 30.0
[agent]
timeout_sec = {agent_timeout}
[environment]
cpus = 1
memory = "512M"
storage_mb = 64
"""

CHECK = """\
import sys
data = open("/app/data.txt").read()
try:
    out = open("/app/out.txt").read()
except OSError:
    sys.exit(1)
sys.exit(0 if out == data[::-1] else 1)
"""

TEST_SH = """\
#!/bin/bash
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""

SOLVE = "python3 -c \"d=open('data.txt').read(); open('/app/out.txt','w').write(d[::-1])\"\n"


def make_task(root, name, *, dockerfile=None, test_sh=TEST_SH, solve=SOLVE,
              toml=None, agent_timeout=20.0, extra_tests=None):
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(toml or TOML.format(agent_timeout=agent_timeout))
    (d / "instruction.md").write_text("Write /app/data.txt reversed to /app/out.txt.\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile or textwrap.dedent("""\
        FROM python:3.11-slim
        WORKDIR /app
        ENV GREETING=hello
        COPY data.txt /app/data.txt
        """))
    (d / "environment" / "data.txt").write_text("trialbox harbor\n")
    (d / "tests" / "test.sh").write_text(test_sh)
    (d / "tests" / "check.py").write_text(CHECK)
    for rel, text in (extra_tests or {}).items():
        (d / "tests" / rel).write_text(text)
    if solve is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(solve)
    return d


@pytest.fixture(scope="module")
def pool():
    loop = asyncio.new_event_loop()
    p = loop.run_until_complete(CellPool(PoolConfig(warm=2)).start())
    yield loop, p
    loop.run_until_complete(p.close())
    loop.close()


def grade(pool, task, answer, **kw):
    loop, p = pool
    return loop.run_until_complete(asyncio.wait_for(judge_harbor(task, answer, p, **kw), 120))


def test_load_reads_every_part(tmp_path):
    make_task(tmp_path, "reverse")
    [task] = load_harbor(str(tmp_path / "reverse"))
    assert task.task_id == "reverse" and task.instruction.startswith("Write /app/data.txt")
    assert ("data.txt", b"trialbox harbor\n", 0o644) in task.environment_files
    assert dict(task.environment_env) == {"GREETING": "hello"}
    assert task.agent_limits.wall_s == 20 and task.verifier_limits.wall_s == 30
    assert task.agent_limits.memory_mb == 512 and task.agent_limits.disk_mb == 64
    assert {p for p, _d, _m in task.tests} == {"test.sh", "check.py"}
    assert task.has_solution and task.oracle == SOLVE and not task.unsupported


def test_oracle_passes_and_wrong_answers_fail(pool, tmp_path):
    [task] = load_harbor(str(make_task(tmp_path, "reverse")))
    ok = grade(pool, task, task.oracle, oracle_env=True)
    assert ok.outcome is Outcome.PASSED and ok.reward == 1.0, ok
    wrong = grade(pool, task, "cp /app/data.txt /app/out.txt\n")
    assert wrong.outcome is Outcome.FAILED and wrong.reward == 0.0, wrong
    nothing = grade(pool, task, "true\n")
    assert nothing.outcome is Outcome.FAILED and nothing.reward == 0.0, nothing
    # the environment's ENV lines reach the answer's run
    env = grade(pool, task, 'test "$GREETING" = hello && ' + SOLVE)
    assert env.outcome is Outcome.PASSED, env


def test_what_the_agent_plants_outside_app_never_reaches_the_verifier(pool, tmp_path):
    [task] = load_harbor(str(make_task(tmp_path, "reverse")))
    planted = textwrap.dedent("""\
        mkdir -p /logs/verifier /tests
        echo 1 > /logs/verifier/reward.txt
        printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh
        printf 'import sys; sys.exit(0)\\n' > /tests/check.py
        (sleep 30; echo 1 > /logs/verifier/reward.txt) &
        """)
    g = grade(pool, task, planted)
    assert g.outcome is Outcome.FAILED and g.reward == 0.0, g


def test_partial_credit_from_reward_json(pool, tmp_path):
    test_sh = ("#!/bin/bash\npython3 /tests/check.py && a=1 || a=0\n"
               "echo \"{\\\"correct\\\": $a, \\\"style\\\": 0.5}\" > /logs/verifier/reward.json\n")
    [task] = load_harbor(str(make_task(tmp_path, "partial", test_sh=test_sh)))
    g = grade(pool, task, task.oracle, oracle_env=True)
    assert g.rewards == {"correct": 1.0, "style": 0.5} and g.reward == 0.75, g
    assert g.outcome is Outcome.FAILED  # below 1: partial credit, kept on the result
    assert [t.passed for t in g.grade.tests] == [True, False]


def test_no_reward_is_the_answers_unless_the_oracle_fails_too(pool, tmp_path):
    # A verifier that writes a reward only when /app/out.txt exists: an answer that
    # leaves none gets no reward — its failure (the oracle shows the verifier works).
    test_sh = ("#!/bin/bash\n[ -f /app/out.txt ] || exit 3\n"
               "python3 /tests/check.py && echo 1 > /logs/verifier/reward.txt\n")
    [task] = load_harbor(str(make_task(tmp_path, "strict", test_sh=test_sh)))
    g = grade(pool, task, "rm -f /app/data.txt\n")
    assert g.outcome is Outcome.FAILED and "self-inflicted" in g.flags, g
    # A verifier broken for everyone: the oracle gets no reward either -> excluded.
    [broken] = load_harbor(str(make_task(tmp_path, "broken",
                                         test_sh="#!/bin/bash\nexit 0\n")))
    b = grade(pool, broken, "true\n")
    assert b.outcome is Outcome.ERROR and b.reward is None, b
    assert "oracle got no reward either" in b.message
    # A verifier writing garbage: no reward, not a crash.
    [garbage] = load_harbor(str(make_task(
        tmp_path, "garbage", test_sh="#!/bin/bash\necho nan > /logs/verifier/reward.txt\n")))
    assert grade(pool, garbage, "true\n").outcome is Outcome.ERROR
    # Without an oracle nothing proves the verifier broken: the answer's failure.
    [lone] = load_harbor(str(make_task(tmp_path, "lone", test_sh="#!/bin/bash\nexit 0\n",
                                       solve=None)))
    n = grade(pool, lone, "true\n")
    assert n.outcome is Outcome.FAILED and "no-control" in n.flags, n


def test_answer_that_breaks_its_own_workspace_is_failed_not_excluded(pool, tmp_path):
    [task] = load_harbor(str(make_task(tmp_path, "reverse")))
    for answer in ("mkdir -p /app/locked/x && chmod 000 /app/locked\n",
                   "head -c 80000000 /dev/zero > /app/fill; true\n"):
        g = grade(pool, task, answer)
        assert g.outcome in (Outcome.FAILED,), (answer, g)
        assert g.reward in (None, 0.0)


def test_answer_limits_are_its_outcome(pool, tmp_path):
    [task] = load_harbor(str(make_task(tmp_path, "slow", agent_timeout=2.0)))
    g = grade(pool, task, "sleep 60\n")
    assert g.outcome is Outcome.TIMEOUT, g


def test_unsupported_environment_reported_and_the_rest_run(pool, tmp_path):
    make_task(tmp_path, "a-reverse")
    make_task(tmp_path, "b-needs-build", dockerfile=(
        "FROM python:3.11-slim\nWORKDIR /app\nRUN apt-get install -y cowsay\n"))
    make_task(tmp_path, "c-other-base", dockerfile="FROM alpine:3.19\nWORKDIR /app\n")
    make_task(tmp_path, "d-no-oracle", solve=None)
    tasks = load_harbor(str(tmp_path))
    assert [t.task_id for t in tasks] == ["a-reverse", "b-needs-build", "c-other-base",
                                          "d-no-oracle"]
    assert "line 3" in tasks[1].unsupported and "RUN" in tasks[1].unsupported
    assert "alpine" in tasks[2].unsupported
    loop, p = pool
    rows = loop.run_until_complete(run_harbor(tasks, None, p))
    by = {r["task_id"]: r for r in rows}
    assert by["a-reverse"]["outcome"] == "passed" and by["a-reverse"]["reward"] == 1.0
    assert by["b-needs-build"]["outcome"] == "unsupported"
    assert by["c-other-base"]["outcome"] == "unsupported"
    assert by["d-no-oracle"]["outcome"] == "no-answer"
    with pytest.raises(UsageError, match="cannot provide"):
        grade(pool, tasks[1], "true\n")


@pytest.mark.parametrize("edit,needle", [
    (lambda d: (d / "task.toml").write_text("[verifier]\ntimeout_sec = 'soon'\n"),
     "task.toml: [verifier] timeout_sec must be a positive number"),
    (lambda d: (d / "task.toml").write_text("[environment]\nmemory = 'lots'\n"),
     "task.toml: [environment] memory must be a size"),
    (lambda d: (d / "task.toml").write_text("version = \"2.0\"\n"), "task.toml: version"),
    (lambda d: (d / "task.toml").write_text("[verifier\n"), "task.toml: not valid TOML"),
    (lambda d: (d / "task.toml").write_text("verifier = 3\n"), "[verifier] must be a table"),
    (lambda d: (d / "task.toml").write_text("[verifier]\nenv = { 'A B' = 1 }\n"),
     "[verifier] env must be a table"),
    (lambda d: os.remove(d / "tests" / "test.sh"), "tests/test.sh: missing"),
    (lambda d: os.remove(d / "instruction.md"), "instruction.md: missing"),
    (lambda d: os.remove(d / "solution" / "solve.sh"), "has no solve.sh"),
    (lambda d: (d / "environment" / "Dockerfile").write_text(
        "FROM python:3\nWORKDIR /app\nENV =oops\n"), "Dockerfile: line 3: ENV"),
])
def test_malformed_task_names_the_file_and_field(tmp_path, edit, needle):
    d = make_task(tmp_path, "bad")
    edit(d)
    with pytest.raises(HarborError) as e:
        load_harbor(str(d))
    assert needle in str(e.value), str(e.value)
    assert str(d) in str(e.value)


def test_not_a_task_directory(tmp_path):
    with pytest.raises(HarborError, match="no Harbor task here"):
        load_harbor(str(tmp_path))
    with pytest.raises(HarborError, match="no such directory"):
        load_harbor(str(tmp_path / "missing"))


@pytest.mark.parametrize("tier", ["namespace", "gvisor", "container"])
def test_cli_runs_a_data_set_on_every_tier(tmp_path, tier):
    """`trialbox harbor DIR --tier T --json`, as a user runs it: the oracle passes on
    every tier (each tier's root has /app, /tests, /logs), the unsupported task is
    reported, and --answers grades given scripts instead."""
    import json
    import subprocess
    import sys

    make_task(tmp_path, "a-reverse")
    make_task(tmp_path, "b-needs-build", dockerfile=(
        "FROM python:3.11-slim\nWORKDIR /app\nRUN make\n"))
    cmd = [sys.executable, "-m", "trialbox.cli", "harbor", str(tmp_path), "--tier", tier,
           "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {r["task_id"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert rows["a-reverse"]["outcome"] == "passed", rows
    assert rows["b-needs-build"]["outcome"] == "unsupported"
    if tier != "namespace":
        return
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"task_id": "a-reverse", "answer": "true"}) + "\n")
    out = subprocess.run(cmd + ["--answers", str(answers)], capture_output=True, text=True,
                         timeout=300)
    rows = {r["task_id"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert rows["a-reverse"]["outcome"] == "failed" and rows["a-reverse"]["reward"] == 0.0
    answers.write_text("{not json\n")
    bad = subprocess.run(cmd + ["--answers", str(answers)], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "answers.jsonl:1: not JSON" in bad.stderr
