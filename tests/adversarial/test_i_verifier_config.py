"""I: a Harbor verifier's tools read no settings or code from the answer's /app, on the
real namespace tier.

The verifier runs from /app, and in the agent's session HOME was /app too: every tool
that reads per-user or per-directory settings (Python's user site and its `.pth`
files, `$HOME/.local/bin/env` that uv-installing test scripts source, a login shell's
`.bash_profile`, git's `~/.gitconfig` and the repository's own `.git/config` and
hooks) would run the answer's code *as the verifier* — which can then rewrite the
verifier's own check. Each answer below writes a wrong /app/out.txt and plants one such
file; the verifier must still fail it. The trusted link scan that runs before the
verifier must not run the answer's code either."""

from __future__ import annotations

import asyncio

import pytest

from tests.integrations.test_harbor import make_task
from trialbox.judge.harbor import judge_harbor
from trialbox.sandbox.pool import CellPool, PoolConfig
from trialbox.store.harbor import load_harbor
from trialbox.types import Outcome

CHECK = """\
import sys
try:
    out = open("/app/out.txt").read()
except OSError:
    sys.exit(1)
sys.exit(0 if out == open("/tests/expected.txt").read() else 1)
"""
SOLVE = "printf 'secret-42\\n' > /app/out.txt\n"
WRONG = "echo wrong > /app/out.txt\n"

# The payload any planted code runs: it rewrites the verifier's check to pass.
PAYLOAD = ("#!/bin/sh\nprintf 'import sys\\nsys.exit(0)\\n' > /tests/check.py 2>/dev/null\n"
           "exit 0\n")
PLANT_PAYLOAD = f"cat > /app/.p.sh <<'EOF'\n{PAYLOAD}EOF\nchmod +x /app/.p.sh\n"
GIT_INIT = ("git init -q /app && git -C /app add -A && git -C /app -c user.name=a "
            "-c user.email=a@b commit -qm init\n")


def verifier(before_check: str) -> str:
    return ("#!/bin/bash\ncd /app\n" + before_check + "\n"
            "if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt\n"
            "else echo 0 > /logs/verifier/reward.txt; fi\n")


VERIFIERS = {
    "python": verifier(""),
    # terminal-bench's test.sh installs uv and sources its env file from $HOME
    "source-home-env": verifier("source $HOME/.local/bin/env 2>/dev/null || true"),
    "login-shell": verifier("bash -lc true"),
    "git-status": verifier("git status --porcelain >/dev/null 2>&1"),
    "git-diff": verifier("git diff >/dev/null 2>&1"),
    "git-commit": verifier("git add -A 2>/dev/null; git -c user.name=v -c user.email=v@v "
                           "commit -qm check >/dev/null 2>&1"),
    # a verifier that clears its environment before git (trialbox's settings with it)
    "git-commit-env-i": verifier("env -i PATH=/usr/bin:/bin bash -c 'cd /app && git add -A "
                                 "&& git -c user.name=v -c user.email=v@v commit -qm c' "
                                 ">/dev/null 2>&1"),
    "git-in-subdir": verifier("(cd /app/sub 2>/dev/null && git status >/dev/null 2>&1)"),
    # a verifier that clears its environment before its check: HOME (and Python's user
    # site) then come from /etc/passwd's home for the sandbox user
    "python-env-i": ("#!/bin/bash\ncd /app\n"
                     "if env -i PATH=/usr/bin:/bin python3 /tests/check.py; then "
                     "echo 1 > /logs/verifier/reward.txt\n"
                     "else echo 0 > /logs/verifier/reward.txt; fi\n"),
}

USER_SITE = "$(python3 -c 'import site; print(site.getusersitepackages())')"

# (verifier, what the answer plants besides its wrong out.txt)
ATTACKS = {
    "user-site-pth": ("python", f"mkdir -p {USER_SITE} && echo 'import os; os._exit(0)' > "
                                f"{USER_SITE}/zz.pth"),
    "usercustomize": ("python", f"mkdir -p {USER_SITE} && echo 'import os; os._exit(0)' > "
                                f"{USER_SITE}/usercustomize.py"),
    # the user site of the passwd home (where an env -i verifier's Python looks), wherever
    # it is and if the answer can write there at all
    "passwd-home-user-site-pth": (
        "python-env-i", "d=$(env -i PATH=/usr/bin:/bin python3 -c 'import site; "
        "print(site.getusersitepackages())') && mkdir -p \"$d\" && "
        "echo 'import os; os._exit(0)' > \"$d/zz.pth\" || true"),
    "home-local-bin-env": ("source-home-env", "mkdir -p /app/.local/bin && printf "
                           "'echo 1 > /logs/verifier/reward.txt; exit 0\\n' > "
                           "/app/.local/bin/env"),
    "bash-profile": ("login-shell", PLANT_PAYLOAD + "echo 'sh /app/.p.sh' > "
                     "/app/.bash_profile"),
    "home-gitconfig-fsmonitor": ("git-status", PLANT_PAYLOAD + GIT_INIT +
                                 "git config -f /app/.gitconfig core.fsmonitor /app/.p.sh"),
    "repo-fsmonitor": ("git-status", PLANT_PAYLOAD + GIT_INIT +
                       "git -C /app config core.fsmonitor /app/.p.sh"),
    "repo-include-fsmonitor": ("git-status", PLANT_PAYLOAD + GIT_INIT +
                               "git config -f /app/.inc core.fsmonitor /app/.p.sh && "
                               "git -C /app config include.path /app/.inc"),
    "repo-diff-external": ("git-diff", PLANT_PAYLOAD + GIT_INIT +
                           "git -C /app config diff.external /app/.p.sh && "
                           "echo changed >> /app/.p.sh"),
    "repo-textconv": ("git-diff", PLANT_PAYLOAD + GIT_INIT +
                      "echo '* diff=x' > /app/.gitattributes && "
                      "git -C /app config diff.x.textconv /app/.p.sh && "
                      "echo changed >> /app/out.txt"),
    "repo-hook": ("git-commit", PLANT_PAYLOAD + GIT_INIT +
                  "cp /app/.p.sh /app/.git/hooks/pre-commit"),
    "repo-hook-env-cleared": ("git-commit-env-i", PLANT_PAYLOAD + GIT_INIT +
                              "cp /app/.p.sh /app/.git/hooks/pre-commit"),
    "repo-fsmonitor-env-cleared": ("git-commit-env-i", PLANT_PAYLOAD + GIT_INIT +
                                   "git -C /app config core.fsmonitor /app/.p.sh"),
    "repo-hookspath": ("git-commit", PLANT_PAYLOAD + GIT_INIT +
                       "mkdir -p /app/h && cp /app/.p.sh /app/h/pre-commit && "
                       "git -C /app config core.hooksPath /app/h"),
    "gitdir-file-elsewhere": ("git-in-subdir", PLANT_PAYLOAD + "mkdir -p /app/sub && "
                              "git init -q --separate-git-dir=/app/.hidden /app/sub && "
                              "git -C /app/sub config core.fsmonitor /app/.p.sh"),
    # a worktree-style git dir whose common dir (where git reads `config`) has no HEAD
    "commondir-without-head": ("git-diff", PLANT_PAYLOAD + GIT_INIT +
                               "mv /app/.git /app/.common && rm /app/.common/HEAD && "
                               "mkdir /app/.wt && echo 'ref: refs/heads/master' > "
                               "/app/.wt/HEAD && echo ../.common > /app/.wt/commondir && "
                               "mv /app/.common/index /app/.wt/index && "
                               "echo 'gitdir: /app/.wt' > /app/.git && "
                               "git config -f /app/.common/config diff.external /app/.p.sh && "
                               "echo changed >> /app/.p.sh"),
    "bare-repo-discovery": ("git-in-subdir", PLANT_PAYLOAD + "git init -q --bare /app/sub && "
                            "git -C /app/sub config core.fsmonitor /app/.p.sh && "
                            "git -C /app/sub config core.bare false && "
                            "git -C /app/sub config core.worktree /app/sub"),
}


# A repository config git cannot read to its end: the scan must not hang on it (it would
# end as a setup failure, scored 0 only through the oracle's control), nor git after it.
UNREADABLE_CONFIGS = {
    "fifo": "mkfifo /app/.git/config.new && mv /app/.git/config.new /app/.git/config",
    "dev-zero": "ln -sf /dev/zero /app/.git/config",
    "read-only-git-dir": "cp /app/.p.sh /app/.git/hooks/pre-commit; chmod 555 /app/.git",
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
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor-config")
    out = {}
    for name, test_sh in VERIFIERS.items():
        [out[name]] = load_harbor(str(make_task(
            root, name, test_sh=test_sh, solve=SOLVE,
            extra_tests={"expected.txt": "secret-42\n", "check.py": CHECK})))
    return out


@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_each_verifier_tells_right_from_wrong(pool, tasks, name):
    """The control: with nothing planted, the right answer passes (git verifiers on a
    repository the answer made, with a config of its own) and the wrong one fails."""
    # an honest repository's own settings: some kept, some (an alias, a pager) dropped
    setup = (GIT_INIT + "git -C /app config user.name me && git -C /app config alias.st "
             "status && git -C /app config core.pager cat\n") if name.startswith("git") else ""
    if name == "git-in-subdir":
        setup = "mkdir -p /app/sub && git init -q /app/sub\n"
    ok = grade(pool, tasks[name], SOLVE + setup)
    assert ok.outcome is Outcome.PASSED and ok.reward == 1.0, (name, ok)
    if name.startswith("git") and name != "git-in-subdir":
        assert "dropped alias.st, core.pager" in ok.verifier_output, ok.verifier_output
    bad = grade(pool, tasks[name], WRONG + setup)
    assert bad.outcome is Outcome.FAILED and bad.reward == 0.0, (name, bad)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_settings_planted_in_app_never_run_for_the_verifier(pool, tasks, attack):
    which, plant = ATTACKS[attack]
    g = grade(pool, tasks[which], WRONG + plant + "\n")
    assert g.outcome is Outcome.FAILED and g.reward == 0.0, (attack, g)


@pytest.mark.parametrize("how", sorted(UNREADABLE_CONFIGS))
def test_an_unreadable_repository_config_is_replaced_not_waited_on(pool, tasks, how):
    g = grade(pool, tasks["git-commit-env-i"], WRONG + PLANT_PAYLOAD + GIT_INIT +
              UNREADABLE_CONFIGS[how] + "\n")
    assert g.outcome is Outcome.FAILED and g.reward == 0.0, (how, g)
    assert "self-inflicted" not in g.flags and g.verifier_status == "ok", (how, g)
    if how != "read-only-git-dir":
        assert "not a plain file" in g.verifier_output, g.verifier_output


LINK = "ln -s /tests/expected.txt /app/out.txt\n"
SCAN_SUBVERSIONS = {
    "shadow-json": "printf 'import os\\nos._exit(0)\\n' > /app/json.py",
    "user-site-pth": f"mkdir -p {USER_SITE} && echo 'import os; os._exit(0)' > "
                     f"{USER_SITE}/zz.pth",
}


@pytest.mark.parametrize("how", sorted(SCAN_SUBVERSIONS))
def test_the_trusted_link_scan_runs_none_of_the_answers_code(pool, tasks, how):
    """The scan that refuses links into the verifier's files is Python started in /app
    with HOME=/app: an /app/json.py or a user-site .pth would end it with no finding."""
    g = grade(pool, tasks["python"], LINK + SCAN_SUBVERSIONS[how] + "\n")
    assert g.outcome is Outcome.CHEAT and g.reward == 0.0, (how, g)
    assert "link-to-verifier" in g.flags, g


PYTEST_SH = """\
#!/bin/bash
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_out.py; then
  echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
TEST_OUT = """\
def test_out():
    assert open("/app/out.txt").read() == open("/tests/expected.txt").read()
"""
PYTEST_PLANTS = {
    "conftest": "printf 'import os\\nos._exit(0)\\n' > /app/conftest.py",
    "pytest-ini": "printf '[pytest]\\naddopts = --co\\n' > /app/pytest.ini",
    "pyproject": "printf '[tool.pytest.ini_options]\\naddopts = \"--co\"\\n' > "
                 "/app/pyproject.toml",
    "setup-cfg": "printf '[tool:pytest]\\naddopts = --co\\n' > /app/setup.cfg",
    "user-site-plugin": f"mkdir -p {USER_SITE}/evil-1.dist-info && printf 'import os\\n"
                        f"os._exit(0)\\n' > {USER_SITE}/evil.py && printf '[pytest11]\\n"
                        f"evil = evil\\n' > {USER_SITE}/evil-1.dist-info/entry_points.txt "
                        f"&& printf 'Metadata-Version: 2.1\\nName: evil\\nVersion: 1\\n' > "
                        f"{USER_SITE}/evil-1.dist-info/METADATA",
}


@pytest.fixture(scope="module")
def pytest_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor-pytest")
    [task] = load_harbor(str(make_task(
        root, "pytest", test_sh=PYTEST_SH, solve=SOLVE,
        extra_tests={"expected.txt": "secret-42\n", "test_out.py": TEST_OUT})))
    return task


def test_the_pytest_verifier_tells_right_from_wrong(pool, pytest_task):
    ok = grade(pool, pytest_task, SOLVE)
    assert ok.outcome is Outcome.PASSED and ok.reward == 1.0, ok
    bad = grade(pool, pytest_task, WRONG)
    assert bad.outcome is Outcome.FAILED and bad.reward == 0.0, bad


@pytest.mark.parametrize("how", sorted(PYTEST_PLANTS))
def test_pytest_settings_in_app_never_reach_a_verifier_testing_tests(pool, pytest_task, how):
    """pytest run from /app on /tests/...: its rootdir and conftest files come from the
    arguments' directories (/tests and up), never the working directory, and its
    plugins from site-packages — the user site only while HOME was /app."""
    g = grade(pool, pytest_task, WRONG + PYTEST_PLANTS[how] + "\n")
    assert g.outcome is Outcome.FAILED and g.reward == 0.0, (how, g)


HOME_TOML = """\
version = "1.0"
[verifier]
timeout_sec = 30.0
[verifier.env]
HOME = "/app"
[agent]
timeout_sec = 20.0
[environment]
memory = "512M"
storage_mb = 64
"""
HOME_SH = """\
#!/bin/bash
if [ "$(git config --global user.name)" = "secret-42" ]; then
  echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_a_task_that_checks_the_answers_home_says_so_and_keeps_it(pool, tmp_path):
    """Class C: a verifier checking what the answer left in HOME (the agent's HOME is
    /app) sets HOME=/app in [verifier] env and keeps it: the right answer passes."""
    [task] = load_harbor(str(make_task(tmp_path, "home", toml=HOME_TOML, test_sh=HOME_SH,
                                       solve="git config --global user.name secret-42\n")))
    ok = grade(pool, task, task.oracle, oracle_env=True)
    assert ok.outcome is Outcome.PASSED and ok.reward == 1.0, ok
    bad = grade(pool, task, "git config --global user.name guess\n")
    assert bad.outcome is Outcome.FAILED and bad.reward == 0.0, bad
