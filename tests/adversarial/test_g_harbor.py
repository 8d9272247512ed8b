"""G: Harbor tasks under an adversarial answer (trialbox.judge.harbor), on the real
namespace tier. An answer is a bash script run in /app; only /app's files reach the
verifier's session. Whatever it leaves there must not make a wrong answer pass (no
link into the verifier's /tests, /logs or /solution, whichever path spells it), and
nothing it does may get it excluded (reward None) instead of failed."""

from __future__ import annotations

import asyncio

import pytest

from tests.integrations.test_harbor import make_task
from trialbox.judge.harbor import judge_harbor
from trialbox.sandbox.pool import CellPool, PoolConfig
from trialbox.store.harbor import load_harbor
from trialbox.types import Outcome

# A verifier that trusts a file of its own (/tests/expected.txt): the answer must
# produce the same bytes in /app/out.txt without ever seeing them.
EXPECTED_CHECK = """\
import sys
try:
    out = open("/app/out.txt").read()
except OSError:
    sys.exit(1)
sys.exit(0 if out == open("/tests/expected.txt").read() else 1)
"""
SOLVE = "printf 'secret-42\\n' > /app/out.txt\n"

# Every way the answer can spell "the verifier's own file" as a link in /app.
LINKS = {
    "absolute": "ln -s /tests/expected.txt /app/out.txt",
    "real-path": "ln -s /tmp/tests/expected.txt /app/out.txt",
    "relative": "ln -s ../tmp/tests/expected.txt /app/out.txt",
    "via-proc": "ln -s /proc/self/root/tests/expected.txt /app/out.txt",
    "via-dir": "ln -s /tests /app/t && ln -s t/expected.txt /app/out.txt",
    "chain": "ln -s /tmp /app/a && ln -s a/tests/expected.txt /app/out.txt",
    "dir-link": "rm -rf /app/sub; ln -s /tests /app/sub; ln -s sub/expected.txt /app/out.txt",
    "via-cwd": "ln -s /proc/self/cwd/../tests/expected.txt /app/out.txt",
}


@pytest.fixture(scope="module")
def pool():
    loop = asyncio.new_event_loop()
    p = loop.run_until_complete(CellPool(PoolConfig(warm=2)).start())
    yield loop, p
    loop.run_until_complete(p.close())
    loop.close()


def grade(pool, task, answer, **kw):
    loop, p = pool
    return loop.run_until_complete(asyncio.wait_for(judge_harbor(task, answer, p, **kw), 240))


@pytest.fixture(scope="module")
def expected_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor-adv")
    [task] = load_harbor(str(make_task(root, "expected", solve=SOLVE,
                                       extra_tests={"expected.txt": "secret-42\n",
                                                    "check.py": EXPECTED_CHECK})))
    return task


def test_the_expected_task_tells_right_from_wrong(pool, expected_task):
    ok = grade(pool, expected_task, expected_task.oracle, oracle_env=True)
    assert ok.outcome is Outcome.PASSED, ok
    wrong = grade(pool, expected_task, "echo guess > /app/out.txt\n")
    assert wrong.outcome is Outcome.FAILED and wrong.reward == 0.0, wrong


@pytest.mark.parametrize("how", sorted(LINKS))
def test_a_link_from_app_into_the_verifiers_files_never_passes(pool, expected_task, how):
    g = grade(pool, expected_task, LINKS[how] + "\n")
    assert g.outcome is not Outcome.PASSED, (how, g)
    assert g.reward in (None, 0.0) and g.outcome is not Outcome.ERROR \
        and g.outcome is not Outcome.INFRA, (how, g)


def test_an_answers_own_links_still_work(pool, expected_task):
    """Class C: links a real answer leaves (a venv's python, links inside /app, a
    dangling one) are not flagged, and the right answer through a link passes."""
    answer = ("ln -s /usr/bin/python3 /app/py && mkdir -p /app/d && "
              "ln -s ../py /app/d/py && ln -s /nonexistent/x /app/dangling && "
              "ln -s d /app/dlink && " + SOLVE.strip() + " && mv /app/out.txt /app/real.txt "
              "&& ln -s real.txt /app/out.txt\n")
    g = grade(pool, expected_task, answer)
    assert g.outcome is Outcome.PASSED and g.reward == 1.0, g


# What an answer can leave in /app to break the archive, the unpacking, the link check
# or the verifier. Each is its own doing: scored 0 (FAILED, TIMEOUT or MEMORY, never
# ERROR/INFRA, never reward None), the oracle's control deciding where needed.
BREAKERS = {
    "chmod-000-app": "chmod 000 /app",
    "locked-subdir": "mkdir -p /app/l/x && chmod 000 /app/l",
    "sparse-huge": "truncate -s 200G /app/big",
    "fifo-as-output": "mkfifo /app/out.txt",
    "newline-names": "touch /app/$'a\\nb' /app/$'-\\n--checkpoint-action=exec=true' /app/'*'",
    "link-loop": "ln -s loop1 /app/loop2 && ln -s loop2 /app/loop1",
    "socket": "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/app/out.txt')\"",
}


@pytest.mark.parametrize("how", sorted(BREAKERS))
def test_what_an_answer_leaves_in_app_never_excludes_it(pool, expected_task, how):
    g = grade(pool, expected_task, BREAKERS[how] + "\n")
    assert g.outcome in (Outcome.FAILED, Outcome.TIMEOUT, Outcome.MEMORY), (how, g)
    assert g.reward == 0.0, (how, g)


# A verifier whose tools Python starts from /app (the working directory): an answer file
# named like a module they import would run in their place.
UNITTEST_SH = """\
#!/bin/bash
cd /app
if python3 -m unittest discover -s /tests -p 'test_*.py'; then
  echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
TEST_OUT = """\
import unittest
from helper import expected   # a helper next to the test, in /tests
class T(unittest.TestCase):
    def test_out(self):
        self.assertEqual(open("/app/out.txt").read(), expected())
"""
HELPER = "def expected():\n    return open('/tests/expected.txt').read()\n"

SHADOWS = {
    "unittest": "printf 'import sys; sys.exit(0)\\n' > /app/unittest.py",
    "unittest-package": "mkdir -p /app/unittest && printf 'import sys; sys.exit(0)\\n' "
                        "> /app/unittest/__init__.py && cp /app/unittest/__init__.py "
                        "/app/unittest/__main__.py",
    "runpy-dependency": "printf 'import os; os._exit(0)\\n' > /app/argparse.py",
    "sitecustomize": "printf 'import os; os._exit(0)\\n' > /app/sitecustomize.py",
}


@pytest.fixture(scope="module")
def unittest_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor-shadow")
    [task] = load_harbor(str(make_task(
        root, "shadow", test_sh=UNITTEST_SH, solve=SOLVE,
        extra_tests={"expected.txt": "secret-42\n", "test_out.py": TEST_OUT,
                     "helper.py": HELPER})))
    return task


def test_the_unittest_task_tells_right_from_wrong(pool, unittest_task):
    ok = grade(pool, unittest_task, SOLVE)
    assert ok.outcome is Outcome.PASSED and ok.reward == 1.0, ok  # /tests helpers import
    bad = grade(pool, unittest_task, "echo wrong > /app/out.txt\n")
    assert bad.outcome is Outcome.FAILED and bad.reward == 0.0, bad


@pytest.mark.parametrize("how", sorted(SHADOWS))
def test_an_answer_file_shadowing_a_module_never_runs_for_the_verifier(pool, unittest_task,
                                                                        how):
    """The verifier's Python never puts /app first on sys.path (PYTHONSAFEPATH, /tests
    on PYTHONPATH): /app/unittest.py and the like are never imported in place of the
    real modules, so a wrong answer planting one still fails."""
    g = grade(pool, unittest_task, "echo wrong > /app/out.txt\n" + SHADOWS[how] + "\n")
    assert g.outcome is Outcome.FAILED and g.reward == 0.0, (how, g)
