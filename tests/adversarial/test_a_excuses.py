"""Class A: a candidate cannot get its own attempt excluded (reward None).

Each attack is a program a reward-hacking policy could write: it breaks the judge's
machinery from inside its own sandbox when it is about to fail. Every one of them ended
`infra` or `error` (excluded) before issue 14; now each is the candidate's outcome —
failed, timeout or cheat, reward 0, never retried — and the machinery is proven healthy
by a control when it cannot tell at once (retry.py). An anti-cheat flag changes none of
this (issue 27): it is recorded, and the control decides. docs/adversary.md, section A.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest

from tests.judge.conftest import JudgeRunner
from trialbox.judge.evaluate import evaluate, reward_of
from trialbox.judge.anticheat import Flag, noted
from trialbox.judge.function import JudgeConfig, _with_flags, judge_function, open_harness
from trialbox.judge.retry import SELF_INFLICTED, Control, with_infra_retries
from trialbox.judge.stdio import StdioJudgeConfig, judge_stdio
from trialbox.judge.stdio import _with_flags as stdio_with_flags
from trialbox.sandbox.languages import language
from trialbox.types import ExecResult, ExecStatus, Grade, Limits, Outcome, Task, TaskKind, \
    TestCase

@pytest.fixture(scope="module")
def runner() -> Iterator[JudgeRunner]:
    """A judge pool (tests/judge/conftest.py: the shipped configuration)."""
    r = JudgeRunner()
    yield r
    r.close()


CONFIG = JudgeConfig(candidate_limits=Limits(wall_s=30, cpu_s=20, memory_mb=256, disk_mb=16),
                     harness_limits=Limits(wall_s=30, cpu_s=20, memory_mb=256, disk_mb=16),
                     call_timeout_s=5, load_timeout_s=5)
"""A 256 MiB harness and the default call and load limits: 16 MiB of `[],` parsed is
~385 MB, so before issue 14 the parser got the harness OOM-killed (infra, three
times)."""

PATIENT = dataclasses.replace(CONFIG, call_timeout_s=20, load_timeout_s=20)
"""Limits long enough for the old harness to read a 16 MiB frame whole (it buffered it
quadratically: on a loaded machine that alone took over 5 s, a timeout, not the OOM);
the new one refuses it as soon as it has it, so these cost nothing now."""

RAW = """
import os, struct
import _trialbox_stub as _s


def _raw(body):  # a frame written straight to the judge's channel, through the stub
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        view = view[os.write(_s.CHANNEL, view):]
"""

NESTED_16MIB = "b'[' + b'[],' * ((16 << 20) // 3 - 2) + b'[]]'"


def square_task(*tests: str, reference: bool = True) -> Task:
    return Task("adv/square", TaskKind.FUNCTION, "def square(x):\n", entry_point="square",
                canonical_solution="    return x * x\n" if reference else "",
                hidden_tests=tuple(TestCase(f"test_{i}", code) for i, code in
                                   enumerate(tests or ("assert candidate(3) == 9",
                                                       "assert candidate(4) == 16"))))


def judge(runner, task: Task, completion: str, config: JudgeConfig = CONFIG) -> Grade:
    return runner.run(judge_function(task, completion, runner.pool, config), timeout=300)


def assert_scored_zero(g: Grade) -> None:
    """The candidate's own outcome: reward 0, not excluded, no second try."""
    assert g.outcome in (Outcome.FAILED, Outcome.TIMEOUT, Outcome.CHEAT), (g.outcome,
                                                                          g.message)
    assert reward_of(g) == 0.0 and g.pass_rate is not None and g.attempts == 1, (
        reward_of(g), g.attempts, g.message)


def said(g: Grade, text: str) -> bool:
    """Whether the grade's message or a test's says `text`."""
    return text in g.message or any(text in t.message for t in g.tests)


# -- frames the candidate writes itself ------------------------------------------------

@pytest.mark.parametrize("when", ["at load", "in a call"])
def test_a_16_mib_frame_of_nested_lists_is_refused_before_parsing(runner, when):
    """16 MiB of `[],` to the channel: counted from its bytes and refused before the
    JSON parser builds ~385 MB of lists. Before: the harness was OOM-killed, `infra`."""
    send = f"_raw({NESTED_16MIB})\nimport time; time.sleep(30)\n"
    if when == "at load":
        completion = "    return x * x\n" + RAW + send
    else:
        completion = "    " + "\n    ".join(send.splitlines()) + "\n" + RAW
    g = judge(runner, square_task("assert candidate(3) == 9"), completion, PATIENT)
    assert_scored_zero(g)
    assert said(g, "refused before parsing"), (g.message, g.tests)


GARBLED = {
    # at load, through the stub's own sender: the old harness formatted it with `%`
    "load_error with a tuple": "_s.send([0, 'load_error', (1, 2)])",
    "load_error with a dict": "_s.send([0, 'load_error', {'a': (1,)}])",
    "a frame of the wrong shape": "_s.send([0, 'ready'])",
    "a kind that is not a string": "_s.send([0, 7, None])",
    "bytes that are not UTF-8": "_raw(b'\\xff\\xfe[0,')",
    "bytes that are not JSON": "_raw(b'[0,\"ready\",nul')",
    "a length past the frame limit": "os.write(_s.CHANNEL, b'\\xff\\xff\\xff\\xff')",
    "a cut-short frame": "os.write(_s.CHANNEL, b'\\x00\\x00\\x01\\x00[0,')",
    "a huge int, unprintable": "_s.send([0, 'load_error', 10 ** 5000])",
}


@pytest.mark.parametrize("frame", sorted(GARBLED))
def test_garbled_frames_from_the_candidate_are_its_failure(runner, frame):
    """Malformed, garbled or hostile frames, sent before the stub's own "ready": each
    is the candidate's failure to load (or to answer). Before: a `%` on a tuple or a
    dict crashed the harness's job (`error`, excluded)."""
    completion = "    return x * x\n" + RAW + GARBLED[frame] + "\n"
    g = judge(runner, square_task(), completion)
    assert_scored_zero(g)


@pytest.mark.parametrize("answer", [
    "[call, 'raised', (1, 2)]", "[call, 'raised', {'x': 1}]", "[call, 'bad_return', (3,)]",
    "[call, 'ready', None]", "[call, 'ok']"])
def test_garbled_answers_to_a_call_are_its_failure(runner, answer):
    """The same in a call, the answer's id right (the harness numbers calls from 1)."""
    completion = ("    global call\n    call += 1\n    _s.send(" + answer + ")\n"
                  "    import time; time.sleep(30)\n" + RAW + "call = 0\n")
    g = judge(runner, square_task("assert candidate(3) == 9"), completion)
    assert_scored_zero(g)


# -- answers that make the trusted test's own work explode ------------------------------

P = 2**61 - 1  # ints equal mod P share a hash


def test_an_answer_of_colliding_values_is_refused_not_fed_to_set(runner):
    """A list of distinct ints that all hash alike: the trusted test's `set(...)` of it
    is one quadratic C call the alarm cannot interrupt. Refused as hash flooding when
    decoded. Before: the server stopped answering, `infra` three times."""
    task = Task("adv/uniq", TaskKind.FUNCTION, "def ids(n):\n", entry_point="ids",
                canonical_solution="    return list(range(n))\n",
                hidden_tests=(TestCase("test_0", "assert len(set(candidate(5))) == 5"),))
    g = judge(runner, task, f"    return [i * {P} for i in range(1, 100_000)]\n")
    assert_scored_zero(g)
    assert said(g, "hash flooding"), (g.message, g.tests)


COLLIDING_PAIRS = """
M = (1 << 64) - 1
X1, X2, X5 = 11400714785074694791, 14029467366897019727, 2870177450012600261


def _pairs(n):
    # [a, b] whose tuple (a, b) hashes to one value (CPython's xxHash-based tuplehash),
    # with distinct a and b: no two numbers of the answer share a hash
    inv2, out, a = pow(X2, -1, 1 << 64), [], 0
    while len(out) < n:
        a += 1
        acc = (X5 + a * X2) & M
        acc = (((acc << 31) | (acc >> 33)) & M) * X1 & M
        hb = (-acc * inv2) & M
        hb = hb - (1 << 64) if hb >> 63 else hb
        if -(1 << 61) + 2 < hb < (1 << 61) - 2 and hb != -1:
            out.append([a, hb])
    return out


PAIRS = _pairs(120_000)
"""


def test_values_the_test_derives_that_collide_are_caught_by_the_control(runner):
    """No two numbers in the answer share a hash, but the tuples the test builds from
    them all do: the codec cannot see it, and the server hangs in `set(...)`. The attempt
    would be `infra`; the control (the reference solution) passes on the same machinery,
    so it is the candidate's failure: no retry, flagged. Before: `infra` (excluded)."""
    task = Task("adv/points", TaskKind.FUNCTION, "def points(n):\n", entry_point="points",
                canonical_solution="    return [[i, i] for i in range(n)]\n",
                hidden_tests=(TestCase(
                    "test_0", "pts = candidate(4)\nassert len({tuple(p) for p in pts}) == 4"),))
    g = judge(runner, task, "    return PAIRS\n" + COLLIDING_PAIRS)
    assert_scored_zero(g)
    assert "self_inflicted_infra" in g.flags and "the reference solution" in g.message, (
        g.flags, g.message)


def test_an_answer_fed_back_one_level_too_deep_is_the_candidates_failure(runner):
    """The test passes the candidate's answer back to it, wrapped; the answer is as deep
    as the codec allows, so the arguments are one level too deep. Before: "the test's
    arguments are not plain data", a task setup error (`error`, excluded)."""
    task = Task("adv/echo", TaskKind.FUNCTION, "def echo(x):\n", entry_point="echo",
                canonical_solution="    return x\n",
                hidden_tests=(TestCase("test_0",
                                       "r = candidate(1)\nassert candidate([r]) == [r]"),))
    deep = "    v = 1\n    for _ in range(62):\n        v = [v]\n    return v\n"
    g = judge(runner, task, deep)
    assert_scored_zero(g)
    assert said(g, "passed back"), (g.message, g.tests)


# -- a flag neither buys nor blocks an exclusion -------------------------------------

def test_a_flag_neither_buys_nor_blocks_an_exclusion_in_every_judge():
    """An attempt that tampered with the judge's descriptor (fd-tamper) and also ended
    `infra` or `error`, in the function, stdio and repository judges alike: the flag is
    recorded and changes nothing — the control decides, as for any attempt. The
    machinery proven healthy, it is the candidate's failure: reward 0, no second try.
    Before issue 14 the exclusion won (reward None); before issue 27 the flag alone made
    it CHEAT, as it made a correct program with the same shape."""
    task = square_task()
    source = "    import os\n    os.write(3, b'x')\n    return x * x\n"
    rc = ExecResult(ExecStatus.OK, exit_code=0)

    async def healthy() -> Control:
        return Control(True, "the reference solution: passed (2/2 tests passed)")

    for outcome in (Outcome.INFRA, Outcome.ERROR):
        for g in (_with_flags(Grade(task.task_id, outcome, message="harness died"), task,
                              source, rc),
                  stdio_with_flags(Grade("s/1", outcome), "import os\nos.write(3, b'x')\n",
                                   language("python"), [rc]),
                  noted(Grade("r/1", outcome), [Flag("fd-tamper", "line 2: os.write")])):
            assert g.outcome is outcome and "fd-tamper" in g.flags, (outcome, g)

            async def attempt(g: Grade = g) -> Grade:
                return g
            done = asyncio.run(with_infra_retries(attempt, 2, g.task_id, healthy))
            assert done.outcome is Outcome.FAILED and done.attempts == 1, (outcome, done)
            assert {"fd-tamper", SELF_INFLICTED} <= set(done.flags), done.flags
            assert reward_of(done) == 0.0


def test_a_flagged_attempt_that_breaks_the_harness_is_its_own_failure_end_to_end(runner):
    """End to end: the colliding tuples hang the harness, and the source writes to fd 3
    (fd-tamper, notable): the control (the reference) passes on the same machinery, so
    it is the candidate's failure — no retry, reward 0, both flags recorded."""
    completion = "    import os\n    os.write(3, b'')\n    return PAIRS\n" + COLLIDING_PAIRS
    task = Task("adv/points", TaskKind.FUNCTION, "def points(n):\n", entry_point="points",
                canonical_solution="    return [[i, i] for i in range(n)]\n",
                hidden_tests=(TestCase(
                    "test_0", "pts = candidate(4)\nassert len({tuple(p) for p in pts}) == 4"),))
    g = judge(runner, task, completion)
    assert_scored_zero(g)
    assert {"fd-tamper", SELF_INFLICTED} <= set(g.flags), (g.outcome, g.flags, g.message)


# -- the failure oracle ----------------------------------------------------------------

GUESSER = """    import os
    if (x,) in SEEN:  # asked again what it just answered: its guess was wrong
        _raw(""" + NESTED_16MIB + """)  # so break the harness, to be excluded instead
        import time; time.sleep(30)
    SEEN.add((x,))
    return x * x if os.urandom(1)[0] & 1 else x * x + 1  # a coin toss
""" + RAW + "SEEN = set()\n"

ORACLE = square_task("assert candidate(7) == 49, 'got %r' % (candidate(7),)")
"""A test that calls the candidate again, with the argument it just got wrong, only when
the assertion fails (an assert's message is evaluated on failure): a failure oracle."""


def test_a_random_guesser_with_a_failure_oracle_scores_its_guess_rate(runner):
    """The guesser answers right half the time; when the oracle tells it it was wrong,
    it sends a 16 MiB frame that used to OOM-kill the harness (`infra`: retried, a new
    coin toss — 7 passes in 8, the rest excluded — and reported deterministic). Now no
    attempt is excluded or retried, about half fail, and repeated gradings disagree."""
    rows, summary = runner.run(evaluate(
        {ORACLE.task_id: ORACLE}, [{"task_id": ORACLE.task_id, "completion": GUESSER}],
        runner.pool, repeat=16, workers=1, config=PATIENT), timeout=900)
    rows = [r.to_dict() for r in rows]
    (row,) = rows
    outcomes = [row["outcome"], *(r["outcome"] for r in row["repeats"])]
    rewards = [row["reward"], *(r["reward"] for r in row["repeats"])]
    assert None not in rewards and set(outcomes) <= {"passed", "failed"}, outcomes
    assert row["attempts"] == 1
    # a fair coin: all 16 alike has probability 2 ** -15
    assert 0 < outcomes.count("passed") < 16, outcomes
    assert row["deterministic"] is False and summary["deterministic"] is False
    assert summary["nondeterministic_task_ids"] == [ORACLE.task_id]


def test_with_no_reference_the_control_is_a_trivial_program(runner):
    """With no reference solution the control is a trivial program (every call answers
    None): it proves the machinery by getting a plain verdict (here: failed) on the same
    harness, so the hang the colliding tuples cause is still the candidate's failure."""
    task = Task("adv/points-noref", TaskKind.FUNCTION, "def points(n):\n",
                entry_point="points", hidden_tests=(TestCase(
                    "test_0", "pts = candidate(4)\nassert len({tuple(p) for p in pts}) == 4"),))
    g = judge(runner, task, "    return PAIRS\n" + COLLIDING_PAIRS)
    assert_scored_zero(g)
    assert "self_inflicted_infra" in g.flags and "a trivial program" in g.message, g.message


def test_a_shared_harness_session_survives_every_attack(runner):
    """The attacks above, one after another on one harness session (as `trialbox eval`
    runs them), then a correct solution: it passes — nothing the candidates did stays."""
    async def body():
        harness = await open_harness(runner.pool, CONFIG)
        try:
            out = []
            for completion in (f"    _raw({NESTED_16MIB})\n" + RAW,
                               "    return x * x\n" + RAW + GARBLED["load_error with a tuple"],
                               "    return x * x\n"):
                out.append(await judge_function(square_task(), completion, runner.pool,
                                                CONFIG, harness))
            return out
        finally:
            await harness.close()
    *bad, good = runner.run(body(), timeout=300)
    for g in bad:
        assert_scored_zero(g)
    assert good.outcome is Outcome.PASSED, good.message
    runner.assert_no_leaks()


# -- the stdio judge: a candidate that breaks its own session ---------------------------

def stdio_double(reference: bool) -> Task:
    cases = tuple(TestCase(f"test_{i}", stdin=f"{i}\n".encode(), expected=f"{2 * i}\n".encode())
                  for i in range(3))
    return Task("adv/stdio-double", TaskKind.STDIO, "double the number", hidden_tests=cases,
                canonical_solution="print(2 * int(input()))\n" if reference else "")


@pytest.mark.parametrize("reference", [True, False])
def test_a_stdio_program_that_locks_its_own_workspace_is_scored_zero(runner, reference):
    """A stdio task's tests run one after another in one session; a wrong program that
    takes its own workspace away (`chmod 000`) makes the next run fail before it
    starts. Whether the sandbox now repairs that or not, the attempt is the
    candidate's: reward 0, no retry (the control — the reference, or a program that
    prints nothing — runs in a fresh session). Before: `infra`, excluded."""
    wrong = "import os\nprint(int(input()) + 1)\nos.chmod('/workspace', 0)\n"
    config = StdioJudgeConfig(limits=Limits(wall_s=10, cpu_s=5, memory_mb=128, disk_mb=16))
    g = runner.run(judge_stdio(stdio_double(reference), wrong, runner.pool, config),
                   timeout=300)
    assert_scored_zero(g)
    right = runner.run(judge_stdio(stdio_double(reference), "print(2 * int(input()))\n",
                                   runner.pool, config))
    assert right.outcome is Outcome.PASSED, right.message
