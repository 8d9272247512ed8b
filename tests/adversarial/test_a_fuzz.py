"""Class A, fuzzed: whatever a candidate sends, returns or does to its own sandbox, the
outcome is never `infra` or `error` (excluded) while the machinery is healthy.

Hypothesis writes the candidate: frames (random bytes, wrong lengths, cut short,
codec-valid messages of any shape and kind, bombs of nested lists) written straight to
the judge's channel at load or in a call, an answer, an exception or an exit after
them, and an operation on its own workspace (chmod 000, removing its files, filling the
disk, thousands of directories). Every attempt runs for real on the namespace tier, on
one shared harness session as `trialbox eval` runs them. docs/adversary.md, section A.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.judge.conftest import JudgeRunner
from tests.judge.test_codec import plain_values
from trialbox.judge import codec
from trialbox.judge.evaluate import reward_of
from trialbox.judge.function import JudgeConfig, judge_function, open_harness
from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.types import Limits, Outcome, Task, TaskKind, TestCase

CONFIG = JudgeConfig(candidate_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                     harness_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                     call_timeout_s=0.5, load_timeout_s=1.5, retries=1)

TASK = Task("adv-fuzz/square", TaskKind.FUNCTION, "def square(x):\n", entry_point="square",
            canonical_solution="    return x * x\n",
            hidden_tests=(TestCase("test_0", "assert candidate(3) == 9"),
                          TestCase("test_1", "r = candidate(4)\nassert r == 16, candidate(r)")))


class Session:
    def __init__(self) -> None:
        self.runner = JudgeRunner()
        self.harness: NamespaceSandbox = self.runner.run(open_harness(self.runner.pool, CONFIG))

    def close(self) -> None:
        self.runner.run(self.harness.close())
        try:
            self.runner.assert_no_leaks()  # every candidate and the harness are gone
        finally:
            self.runner.close()


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    s = Session()
    yield s
    s.close()


def framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


kinds = st.sampled_from(["ready", "load_error", "ok", "raised", "bad_return", "", "é"])
frames = st.one_of(
    st.binary(max_size=64).map(framed),                                      # noise
    st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=32)).map(       # any length
        lambda p: p[0].to_bytes(4, "big") + p[1]),
    st.tuples(st.integers(-2, 3), kinds, plain_values).map(                  # valid codec
        lambda m: framed(codec.encode(list(m)))),
    st.tuples(st.integers(0, 3), plain_values).map(                           # wrong shape
        lambda m: framed(codec.encode(list(m)))),
    st.integers(1, (16 << 20) // 3 - 2),              # a list bomb of k `[],`, made in the
                                                      # sandbox (up to 16 MiB: ~385 MB parsed)
    st.integers(1, 5_000).map(                                               # depth bombs
        lambda k: framed(b"[" * k + b"]" * k)),
)

WORKSPACE_OPS = {
    "none": "",
    "chmod 000 the workspace": "os.chmod('/workspace', 0)",
    "chmod 000 its solution": "os.chmod('/workspace/solution.py', 0)",
    "remove its solution": "os.unlink('/workspace/solution.py')",
    "fill the disk": "open('/workspace/fill', 'wb').write(b'x' * (20 << 20))",
    "many directories": "[os.mkdir('/workspace/d%d' % i) for i in range(2000)]",
    "a directory for a file": "os.mkdir('/workspace/solution.pyc')",
}

AFTER = {
    "answer": "return x * x",
    "answer wrong": "return x + 1",
    "sleep": "import time; time.sleep(5)",
    "exit": "os._exit(0)",
    "raise": "raise ValueError(x)",
}

CANDIDATE = """    import os
    global calls
    calls += 1
    if calls == 1 and WHEN == "call":
        _send()
    {after}


import os
import _trialbox_stub as _s

WHEN = {when!r}
FRAMES = {frames!r}
calls = 0


def _send():
    for data in FRAMES:
        if type(data) is int:
            body = b"[" + b"[]," * data + b"[]]"
            data = len(body).to_bytes(4, "big") + body
        view = memoryview(data)
        while view:
            view = view[os.write(_s.CHANNEL, view):]


try:
    {op}
except OSError:
    pass
if WHEN == "load":
    _send()
"""


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(frames, min_size=1, max_size=3), st.sampled_from(["load", "call"]),
       st.sampled_from(sorted(AFTER)), st.sampled_from(sorted(WORKSPACE_OPS)))
# known shapes first (each crashed the harness's job before issue 14: `error`), then
# whatever hypothesis draws
@example([framed(codec.encode([0, "load_error", (1, 2)]))], "load", "answer", "none")
@example([framed(codec.encode([1, "raised", (1, 2, 3)]))], "call", "sleep",
         "chmod 000 the workspace")
@example([framed(codec.encode([0, "load_error", 10 ** 5000]))], "load", "answer wrong",
         "remove its solution")
def test_no_candidate_behaviour_ends_excluded(session, sent, when, after, op):
    completion = CANDIDATE.format(after=AFTER[after], when=when, frames=sent,
                                  op=WORKSPACE_OPS[op] or "pass")
    g = session.runner.run(judge_function(TASK, completion, session.runner.pool, CONFIG,
                                          session.harness), timeout=120)
    assert g.outcome not in (Outcome.INFRA, Outcome.ERROR), (g.outcome, g.message, when,
                                                             after, op)
    assert reward_of(g) is not None and g.attempts == 1


def test_the_machinery_is_healthy_after_the_fuzzing(session):
    """The reference solution still passes on the same harness session."""
    g = session.runner.run(judge_function(TASK, TASK.canonical_solution,
                                          session.runner.pool, CONFIG, session.harness))
    assert g.outcome is Outcome.PASSED, g.message
