"""The repository judge on snapshots of the task's tree (judge/repo_snapshot.py): every
session of an attempt is a fork of the task's starting workspace with only the answer's
changes written. Shown for real on the namespace tier: the verdicts are the copying
path's, answer by answer (on both judge tiers); what one candidate writes no other
candidate sees; a removal leaves no directory a copy would not have; trees near or past
`disk_mb` take the copying path and grade as it does."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tests.judge.test_repo import (
    CONFTEST_ALL_PASS,
    FAST,
    GOOD,
    GOOD_OPS,
    IN_PROCESS,
    TASK,
    hidden_from_scan,
    wrong_ops,
)
from trialbox.errors import SandboxStartError, UsageError
from trialbox.judge.repo import judge_repo
from trialbox.judge.repo_snapshot import release_trees, snapshots_for
from trialbox.sandbox.snapshot import TreeSnapshots
from trialbox.types import Grade, Outcome, Task, TaskKind

COPY = replace(FAST, snapshots=False)

ANSWERS = {
    "good-patch": GOOD,
    "good-files": {"calc/ops.py": GOOD_OPS},
    "wrong": wrong_ops(""),
    "no-change": {},
    "syntax-error": {"calc/ops.py": "def add(a, b)\n    return a + b\n"},
    "new-module": {"calc/ops.py": "from calc.helper import plus as add\n",
                   "calc/helper.py": "def plus(a, b):\n    return b + a\n"},
    "delete-module": {"calc/ops.py": None},
    "conftest": {"conftest.py": CONFTEST_ALL_PASS},
    "exit-hidden": wrong_ops(hidden_from_scan("import os; os._exit(0)")),
    "rewrite-tests": wrong_ops(hidden_from_scan(
        "import glob\nfor p in glob.glob('/workspace/repo/tests/test_*.py'):\n"
        "    open(p, 'w').write('def test_add():\\n    pass\\n')\n")),
}


def verdict(g: Grade) -> tuple[object, ...]:
    """Everything of a grade but its timings and resource figures."""
    return (g.outcome, g.flags, g.message,
            tuple((t.name, t.passed, t.message, t.hidden) for t in g.tests))


def test_snapshot_path_gives_the_copying_paths_verdicts(runner):
    trees = snapshots_for(runner.pool)
    assert trees is not None
    forked, made = trees.forked, trees.trees.made
    for name, answer in ANSWERS.items():
        snap = runner.run(judge_repo(TASK, answer, runner.pool, FAST))
        copy = runner.run(judge_repo(TASK, answer, runner.pool, COPY))
        assert verdict(snap) == verdict(copy), name
    assert verdict(runner.run(judge_repo(TASK, GOOD, runner.pool, FAST)))[0] \
        is Outcome.PASSED
    # the snapshot path was taken: two sessions per attempt (and per control), forked;
    # at most two snapshots made for the task (the tests' view and the candidate's)
    assert trees.forked - forked >= 2 * (len(ANSWERS) + 1)
    assert trees.trees.made - made <= 2


@pytest.mark.parametrize("name", ["good-patch", "wrong", "exit-hidden", "delete-module"])
def test_in_process_tier_on_snapshots_gives_the_copying_paths_verdicts(runner, name):
    snap = runner.run(judge_repo(TASK, ANSWERS[name], runner.pool, IN_PROCESS))
    copy = runner.run(judge_repo(TASK, ANSWERS[name], runner.pool,
                                 replace(IN_PROCESS, snapshots=False)))
    assert verdict(snap) == verdict(copy)


# Candidate A's code, when the tests import it, writes into its own tree (a new module,
# the package's __init__ poisoned, a visible test rewritten) and passes only if those
# writes took (its add() needs the module it wrote).
WRITER = {"calc/ops.py": (
    "with open('/workspace/repo/calc/leak.py', 'w') as f:\n"
    "    f.write('LEAK = 0\\n')\n"
    "with open('/workspace/repo/calc/__init__.py', 'w') as f:\n"
    "    f.write('raise ImportError(\"poisoned by another candidate\")\\n')\n"
    "from calc.leak import LEAK\n\n\n"
    "def add(a, b):\n    return a + b + LEAK\n")}
# Candidate B passes only in a tree without A's writes.
READER = {"calc/ops.py": (
    "import os\n"
    "if os.path.exists('/workspace/repo/calc/leak.py'):\n"
    "    raise ImportError('saw another candidate\\'s file')\n\n\n"
    "def add(a, b):\n    return a + b\n")}


def test_one_candidates_writes_never_reach_another(runner):
    async def body() -> list[Grade]:
        pool = runner.pool
        first = [await judge_repo(TASK, WRITER, pool, FAST),
                 await judge_repo(TASK, READER, pool, FAST)]
        both = await asyncio.gather(*(judge_repo(TASK, a, pool, FAST)
                                      for a in (WRITER, READER, WRITER, READER)))
        return first + list(both)
    grades = runner.run(body())
    for g in grades[::2]:  # the writer's writes took, in its own fork
        assert g.outcome is Outcome.PASSED, (g.outcome, g.message)
    for g in grades[1::2]:  # and no other fork, nor the snapshot, got them
        assert g.outcome is Outcome.PASSED, (g.outcome, g.message)
    # the control: the reader does fail in a tree that holds the writer's module
    g = runner.run(judge_repo(TASK, {**READER, "calc/leak.py": "LEAK = 0\n"},
                              runner.pool, FAST))
    assert g.outcome is Outcome.FAILED and not any(t.passed for t in g.tests)
    [visible] = [t for t in g.tests if not t.hidden]
    assert "another candidate" in visible.message, visible


EXTRA = Task(
    "calc-extra", TaskKind.REPO, prompt="Remove calc.extra.",
    files=(("calc/__init__.py", b""), ("calc/ops.py", GOOD_OPS.encode()),
           ("calc/extra/deep/mod.py", b"X = 1\n")),
    test_files=(("tests/test_gone.py", (
        b"import os\n\n\ndef test_extra_is_gone():\n"
        b"    assert not os.path.exists('/workspace/repo/calc/extra')\n")),),
    test_command=("pytest",))


def test_a_removal_leaves_no_directory_a_copy_would_not_have(runner):
    for config in (FAST, COPY, IN_PROCESS):
        g = runner.run(judge_repo(EXTRA, {"calc/extra/deep/mod.py": None}, runner.pool,
                                  config))
        assert g.outcome is Outcome.PASSED, (config, g.message)
        g = runner.run(judge_repo(EXTRA, {}, runner.pool, config))
        assert g.outcome is Outcome.FAILED, (config, g.message)


def test_trees_near_or_past_disk_mb_take_the_copying_path_and_grade_as_it_does(runner):
    trees = snapshots_for(runner.pool)
    assert trees is not None
    for mb in (31, 40):  # FAST.limits.disk_mb = 32: within HEADROOM of it, then past it
        answer = {"calc/ops.py": GOOD_OPS, "calc/blob.txt": "x" * (mb << 20)}
        copied = trees.copied
        snap = runner.run(judge_repo(TASK, answer, runner.pool, FAST))
        assert trees.copied > copied, mb
        copy = runner.run(judge_repo(TASK, answer, runner.pool, COPY))
        assert verdict(snap) == verdict(copy), mb
    assert "could not be written" in snap.message, snap.message


def test_release_and_bad_input(runner):
    async def body() -> None:
        await judge_repo(TASK, GOOD, runner.pool, FAST)
        trees = snapshots_for(runner.pool)
        assert trees is not None and trees.trees._snaps
        await release_trees(runner.pool)
        assert not trees.trees._snaps and snapshots_for(runner.pool) is not trees
        g = await judge_repo(TASK, GOOD, runner.pool, FAST)  # a fresh cache serves
        assert g.outcome is Outcome.PASSED
    runner.run(body())
    with pytest.raises(UsageError, match="snapshots must be a bool"):
        replace(FAST, snapshots="yes")


def test_a_run_has_the_copying_paths_room_on_a_fork(runner):
    """A fork's disk_mb counts only what it writes on top of the snapshot, so the judge
    gives it disk_mb less the tree: a candidate writing 16 MiB at run time beside a
    20 MiB tree overflows 32 MiB on both paths, one writing 6 MiB fits on both."""
    big = replace(TASK, task_id="calc-data",
                  files=TASK.files + (("data/blob.bin", b"\x07" * (20 << 20)),))
    trees = snapshots_for(runner.pool)
    assert trees is not None
    for mb, outcome in ((16, Outcome.FAILED), (6, Outcome.PASSED)):
        answer = {"calc/ops.py": (
            f"with open('/workspace/repo/out.bin', 'wb') as f:\n"
            f"    f.write(b'x' * ({mb} << 20))\n\n\n" + GOOD_OPS)}
        forked = trees.forked
        snap = runner.run(judge_repo(big, answer, runner.pool, FAST))
        assert trees.forked > forked  # the snapshot path served it
        copy = runner.run(judge_repo(big, answer, runner.pool, COPY))
        assert copy.outcome is outcome, (mb, copy.message)
        assert verdict(snap) == verdict(copy), mb


def test_tree_snapshots_are_bounded_by_count_and_bytes(runner):
    lim = FAST.limits

    async def body() -> None:
        trees = TreeSnapshots(runner.pool, max_trees=2, max_bytes=3 << 20)
        try:
            tree = [{"f": bytes([i]) * (2 << 20)} for i in range(3)]
            # concurrently: a tree is evicted while another's fork is being opened
            forks = await asyncio.gather(*(trees.open(t, limits=lim) for t in tree))
            for t, sb in zip(tree, forks, strict=True):
                async with sb:  # each fork holds its tree, evicted or not
                    assert await sb.read_file("f") == t["f"]
            assert trees.made == 3 and len(trees._snaps) == 1  # 2 MiB each, 3 MiB bound
            fresh = TreeSnapshots(runner.pool, max_trees=2)
            for t in tree:
                await fresh.snapshot(t, limits=lim)
            assert len(fresh._snaps) == 2
            await fresh.close()
        finally:
            await trees.close()
    runner.run(body())


def test_snapshot_machinery_failing_means_copying_never_another_verdict(runner, monkeypatch):
    """A kernel without overlay layers as fds fails every snapshot (SandboxStartError):
    each attempt copies instead and grades as the copying path does; after MAX_FAILURES
    in a row the path is off for the pool, saying why."""
    async def refuse(self, *args, **kwargs):
        raise SandboxStartError("fsconfig(lowerdir+) refused: EINVAL (injected)")

    async def body() -> list[Grade]:
        await release_trees(runner.pool)
        monkeypatch.setattr(TreeSnapshots, "snapshot", refuse)
        try:
            return [await judge_repo(TASK, a, runner.pool, FAST)
                    for a in (GOOD, wrong_ops(""), GOOD, GOOD)]
        finally:
            monkeypatch.undo()
    grades = runner.run(body())
    assert [g.outcome for g in grades] == [Outcome.PASSED, Outcome.FAILED,
                                           Outcome.PASSED, Outcome.PASSED]
    trees = snapshots_for(runner.pool)
    assert trees is not None and trees.forked == 0
    assert trees.off is not None and "injected" in trees.off, trees.off
    runner.run(release_trees(runner.pool))  # the next grades have the path again
