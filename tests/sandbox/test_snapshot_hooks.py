"""The two uses snapshots were built for, through their hooks: a GRPO group whose samples
all start from one prepared state (the agent loop, unchanged, with `snap.open` as its
opener), and N candidates' diffs run against one checked-out tree without copying it
N times (TreeSnapshots + apply_changes, for a repository judge)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from trialbox.rollout.agent import AgentConfig, rollout
from trialbox.rollout.policy import ScriptedPolicy
from trialbox.sandbox import PoolConfig
from trialbox.sandbox.snapshot import TreeSnapshots, apply_changes, tree_changes
from trialbox.schedule.lease import DirectLeaser
from trialbox.types import ExecStatus, Limits, Task, TaskKind, TestCase
from tests.conftest import Runner

LIM = Limits(wall_s=30, cpu_s=30, memory_mb=256, disk_mb=32, output_bytes=1 << 16)
CONFIG = AgentConfig(max_concurrent_env=4, max_new_tokens=400, exec_limits=LIM)
"""Roomy limits for the episodes' own runs: time is not under test here."""


@pytest.fixture(scope="module")
def hook_runner() -> Iterator[Runner]:
    r = Runner(PoolConfig(warm=4))
    yield r
    r.close()


SQUARE = Task(
    task_id="square", kind=TaskKind.FUNCTION, entry_point="square",
    prompt='def square(x):\n    """Return x squared."""\n',
    visible_tests=(TestCase("v1", code="assert candidate(3) == 9"),),
    hidden_tests=(TestCase("h1", code="assert candidate(12) == 144"),))

# Every sample's code needs the prepared state in its own session, and changes it: a
# sample that saw another's change (or no prepared state at all) fails its run.
USES_STATE = """```python
def square(x):
    return x * x

if __name__ == '__main__':  # run in the episode's session (the judge imports it)
    state = open('/workspace/prepared/state.txt').read()
    assert state == 'ready', state
    open('/workspace/prepared/state.txt', 'a').write(' and used')
```"""


def test_a_grpo_group_starts_every_sample_from_one_prepared_state(hook_runner):
    async def body():
        pool = hook_runner.pool
        async with await pool.open(LIM) as prep:
            r = await prep.exec(["python3", "-c", "import os; os.mkdir('prepared');"
                                 "open('prepared/state.txt', 'w').write('ready')"])
            assert r.status is ExecStatus.OK, r
            snap = await prep.snapshot()
        async with snap:
            batch = await rollout(ScriptedPolicy([USES_STATE]), [SQUARE], group_size=8,
                                  max_turns=1, config=CONFIG, pool=pool,
                                  leaser=DirectLeaser(snap.open))
        assert len(batch.trajectories) == 8
        for tr in batch.trajectories:
            [turn] = tr.turns
            assert turn.exec_status is ExecStatus.OK, turn.exec_summary
    hook_runner.run(body())


def test_the_same_group_without_the_prepared_state_fails_its_runs(hook_runner):
    """The control: the check above is real (a plain session has no prepared state)."""
    async def body():
        pool = hook_runner.pool

        async def plain(limits):
            return await pool.open(limits)
        batch = await rollout(ScriptedPolicy([USES_STATE]), [SQUARE], group_size=2,
                              max_turns=1, config=CONFIG, pool=pool,
                              leaser=DirectLeaser(plain))
        assert all(tr.turns[0].exec_status is ExecStatus.EXIT for tr in batch.trajectories)
    hook_runner.run(body())


def _checked_out_tree() -> dict[str, bytes]:
    files = {f"pkg/gen/m{i:03d}.py": f"V{i} = {i}\n".encode() * 200 for i in range(300)}
    files["pkg/__init__.py"] = b""
    files["pkg/gen/__init__.py"] = b""
    files["pkg/calc.py"] = b"def add(a, b):\n    raise NotImplementedError\n"
    files["pkg/stale.py"] = b"raise ImportError('stale module')\n"
    files["tests/test_calc.py"] = (b"from pkg.calc import add\n"
                                   b"def test_add():\n    assert add(2, 3) == 5\n")
    return files


def test_candidates_diffs_run_against_one_checked_out_tree_without_copying_it(hook_runner):
    base = _checked_out_tree()
    tree_bytes = sum(map(len, base.values()))
    right = dict(base, **{"pkg/calc.py": b"def add(a, b):\n    return a + b\n"})
    del right["pkg/stale.py"]
    wrong = dict(base, **{"pkg/calc.py": b"def add(a, b):\n    return a - b\n"})
    new_file = dict(base, **{"pkg/calc.py": b"from pkg.helper import plus as add\n",
                             "pkg/helper.py": b"def plus(a, b):\n    return b + a\n"})
    candidates = [right, wrong, new_file, base]
    expect = [0, 1, 0, 1]

    async def body():
        pool = hook_runner.pool
        trees = TreeSnapshots(pool)
        try:
            for cand, code in zip(candidates, expect, strict=True):
                async with await trees.open(base, under="repo", limits=LIM) as sb:
                    changes = tree_changes(base, cand)
                    written = await apply_changes(sb, changes, under="repo")
                    assert written == sum(len(d) for d in changes.values() if d)
                    r = await sb.exec(["python3", "-m", "pytest", "-q", "-p",
                                       "no:cacheprovider", "tests"], cwd="/workspace/repo")
                    assert r.exit_code == code, (r.stdout[-600:], r.stderr[-600:])
                    st = os.statvfs(sb.dir)  # the fork's own writes: its diff, not the tree
                    assert (st.f_blocks - st.f_bfree) * st.f_frsize < tree_bytes / 4
                    stale = "pkg/stale.py" in await sb.list_files() or \
                        "repo/pkg/stale.py" in await sb.list_files()
                    assert stale is ("pkg/stale.py" in cand)
            assert trees.made == 1  # one tree written, four candidates forked from it
        finally:
            await trees.close()
    hook_runner.run(body())
