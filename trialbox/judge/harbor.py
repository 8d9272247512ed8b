"""Grading Harbor-style tasks (`trialbox.store.harbor`): the agent's answer runs in one
sandbox, the task's verifier in a fresh one, and the reward is read from outside both.

The answer is a bash script (what the task's oracle, solution/solve.sh, is): it runs in
/app, the session's workspace, holding the environment's files. Then:

1. The final /app is archived by a fresh `tar` run in the agent's session (on every tier
   each run ends with all its processes, so nothing the answer left behind is running).
2. A fresh session for the verifier gets that archive in /app, the task's tests/ in
   /tests and an empty /logs/verifier: whatever the answer planted outside /app in its
   own session (a /tests, a /logs/verifier/reward.txt, a process) is gone.
3. `bash /tests/test.sh` runs from /app under the verifier's limits and environment.
4. The reward is read by a run of its own: /logs/verifier/reward.json (an object of
   named numbers; `reward`, when present, is the reward, else their mean) or
   reward.txt (one number). It must be finite: anything else is no reward.

Verdicts: PASSED when the reward is >= 1, FAILED below (the reward is kept on the
result: partial credit is the task's to give); the answer's own limits (time, memory)
are its outcome. No reward at all, or a verifier that could not run, is the answer's
failure unless a control shows the verifier broken: the task's oracle is graded the
same way on the same machinery, and only when it gets no reward either is the attempt
excluded (ERROR: the task is broken; INFRA when the sandbox itself failed). A task
without an oracle has no control: a missing reward is the answer's (flag `no-control`).

What this cannot guarantee (Harbor's contract, not trialbox's choice): the verifier is
the task's own script and usually runs the answer's programs in its own session, so
such a program can write the reward file itself. trialbox's part is that nothing of the
agent's *session* reaches the verifier but /app's files; a task whose tests execute the
agent's code should check outputs the code cannot know in advance (docs/integrations.md).
"""

from __future__ import annotations

import io
import json
import math
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.store.harbor import HarborTask
from trialbox.types import ExecResult, ExecStatus, Grade, Limits, Outcome, TestResult

_STATUS_OUTCOME = {ExecStatus.TIMEOUT: Outcome.TIMEOUT, ExecStatus.MEMORY: Outcome.MEMORY}


@dataclass(frozen=True)
class HarborResult:
    """One graded attempt at a Harbor task."""

    task_id: str
    outcome: Outcome
    reward: float | None = None
    """The reward (None: excluded, or no reward was written)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Every named reward the verifier wrote (reward.json), or {"reward": x}."""
    message: str = ""
    flags: tuple[str, ...] = ()
    agent_status: str = ""
    verifier_status: str = ""
    verifier_output: str = ""
    """The tail of the verifier's stdout and stderr (its own log, for the reader)."""
    wall_ms: float = 0.0

    @property
    def grade(self) -> Grade:
        """As a `Grade`: one test per named reward, passed when it is >= 1."""
        tests = tuple(TestResult(name, value >= 1.0, f"reward {value:g}")
                      for name, value in sorted(self.rewards.items()))
        return Grade(self.task_id, self.outcome, tests=tests, message=self.message,
                     flags=self.flags, wall_ms=self.wall_ms)

    def row(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "outcome": self.outcome.value,
                "passed": self.outcome is Outcome.PASSED, "reward": self.reward,
                "rewards": self.rewards, "message": self.message, "flags": list(self.flags),
                "agent_status": self.agent_status, "verifier_status": self.verifier_status,
                "wall_ms": self.wall_ms}


async def judge_harbor(task: HarborTask, answer: str, provider: SandboxProvider, *,
                       oracle_env: bool = False) -> HarborResult:
    """Grade `answer` (a bash script run in /app) against `task`'s verifier.

    `oracle_env`: run the answer with the task's [solution] env and solution/ files in
    /solution (how the oracle runs); the control does this for the oracle itself."""
    if task.unsupported:
        raise UsageError(f"{task.task_id}: trialbox cannot provide this task's environment: "
                         f"{task.unsupported}")
    if not isinstance(answer, str):
        raise UsageError(f"{task.task_id}: the answer must be a bash script (str), got "
                         f"{type(answer).__name__}")
    result = await _attempt(task, answer, provider, oracle_env)
    if result.reward is not None or result.outcome is not Outcome.ERROR:
        # the answer's own limit without a reward scores 0: None would exclude it
        return result if result.reward is not None else replace(result, reward=0.0)
    # No reward: the answer's doing unless the verifier is shown broken.
    if not task.has_solution:
        return replace(result, outcome=Outcome.FAILED, reward=0.0,
                       flags=(*result.flags, "no-control"),
                       message=result.message + " (the task has no oracle to show the "
                       "verifier works; counted as the answer's failure)")
    if oracle_env and answer == task.oracle:
        return result  # this is the control: its failure is the task's
    control = await _attempt(task, task.oracle, provider, True)
    if control.reward is not None:
        return replace(result, outcome=Outcome.FAILED, reward=0.0,
                       flags=(*result.flags, "self-inflicted"),
                       message=result.message + " (the oracle got a reward from the same "
                       "verifier on the same machinery: the failure is the answer's)")
    infra = "infra" in (control.agent_status, control.verifier_status)
    return replace(result, outcome=Outcome.INFRA if infra else Outcome.ERROR,
                   message=result.message + f"; the oracle got no reward either "
                   f"({control.message}): the {'sandbox' if infra else 'task'} is broken")


async def _attempt(task: HarborTask, answer: str, provider: SandboxProvider,
                   oracle_env: bool) -> HarborResult:
    t0 = time.monotonic()

    def done(outcome: Outcome, message: str, **kw: Any) -> HarborResult:
        return HarborResult(task.task_id, outcome, message=message[:4000],
                            wall_ms=round((time.monotonic() - t0) * 1e3, 3), **kw)

    env = dict(task.environment_env)
    agent_limits = task.agent_limits
    carry_limits = replace(agent_limits, wall_s=60, output_bytes=(agent_limits.disk_mb + 16) << 20)
    async with await provider.open(agent_limits) as sb:
        for path, data, mode in task.environment_files:
            await sb.write_file(path, data, mode)
        if oracle_env:
            env.update(task.solution_env)
            r = await _untar(sb, "/tmp/solution", _tar(task.solution), env)
            if r.status is not ExecStatus.OK or r.exit_code != 0:
                return done(_setup_outcome(r), f"the oracle's files could not be put in "
                            f"/solution: {_why(r)}", agent_status=r.status.value)
        ran = await sb.exec(["bash", "-c", "cat > /tmp/.answer.sh && exec bash "
                             "/tmp/.answer.sh < /dev/null"],
                            stdin=answer.encode("utf-8", errors="surrogateescape"), env=env)
        if ran.status is ExecStatus.INFRA:
            return done(Outcome.ERROR, f"the answer's run failed in the sandbox: {_why(ran)}",
                        agent_status="infra")
        # The answer's limits are its outcome, but the verifier still judges what it left.
        packed = await sb.exec(["tar", "-c", "-C", "/workspace", "."], limits=carry_limits,
                               env=env)
        if packed.status is not ExecStatus.OK or packed.exit_code != 0:
            return done(_STATUS_OUTCOME.get(ran.status, _setup_outcome(packed)),
                        f"/app could not be archived for the verifier: {_why(packed)}",
                        agent_status=ran.status.value)
    async with await provider.open(task.verifier_limits) as vb:
        env = {**dict(task.environment_env), **dict(task.verifier_env)}
        # Python started by the verifier never puts the working directory (/app, the
        # answer's files) or a script's own directory first on sys.path: else an answer
        # file named like a module the verifier's tools import (/app/unittest.py,
        # /app/json.py) runs in their place. /tests is put on the path instead, so test
        # scripts still import their helpers; a verifier that means to import the
        # answer's modules says so (PYTHONPATH=/app in its [verifier] env, or
        # sys.path in its script) — then it runs the answer's code, the documented risk.
        env["PYTHONSAFEPATH"] = "1"
        env["PYTHONPATH"] = ":".join(p for p in ("/tests", env.get("PYTHONPATH", "")) if p)
        env.update(_trusted_settings(dict(task.verifier_env), env))
        for where, data in (("/workspace", packed.stdout), ("/tmp/tests", _tar(task.tests))):
            r = await _untar(vb, where, data, env)
            if r.status is not ExecStatus.OK or r.exit_code != 0:
                return done(_STATUS_OUTCOME.get(ran.status, _setup_outcome(r)),
                            f"the verifier's session could not be prepared ({where}): "
                            f"{_why(r)}", agent_status=ran.status.value)
        links = await vb.exec(["python3", "-c", _LINK_SCAN], env=env,
                              limits=replace(vb.limits, wall_s=60, output_bytes=1 << 16))
        if links.status is not ExecStatus.OK or links.exit_code != 0:
            return done(_STATUS_OUTCOME.get(ran.status, _setup_outcome(links)),
                        f"/app's links could not be checked: {_why(links)}",
                        agent_status=ran.status.value)
        lines = links.stdout.decode("utf-8", "replace").splitlines()
        found = [ln[2:] for ln in lines if ln.startswith("L ")]
        tamed = [ln[2:] for ln in lines if ln.startswith("G ")]
        if found:
            return done(Outcome.CHEAT, "/app holds links into the verifier's own files "
                        f"(/tests, /logs, /solution, /tmp or /proc): {'; '.join(found[:5])}",
                        reward=0.0, rewards={"reward": 0.0}, flags=("link-to-verifier",),
                        agent_status=ran.status.value)
        checked = await vb.exec(["bash", "-c", "mkdir -p /tmp/logs/verifier /tmp/logs/agent "
                                 "&& exec bash /tests/test.sh < /dev/null"], env=env)
        tail = (checked.stdout[-2000:] + checked.stderr[-2000:]).decode("utf-8", "replace")
        if tamed:
            tail = ("trialbox kept only plain settings of /app's git configuration: "
                    + "; ".join(tamed[:5]) + "\n" + tail)
        status = dict(agent_status=ran.status.value, verifier_status=checked.status.value,
                      verifier_output=tail)
        if checked.status is ExecStatus.INFRA:
            return done(Outcome.ERROR, f"the verifier's run failed in the sandbox: "
                        f"{_why(checked)}", **status)
        rewards, why = await _read_reward(vb)
    if rewards is None:  # the answer's limit hit, else ERROR: judge_harbor decides
        outcome = _STATUS_OUTCOME.get(ran.status, Outcome.ERROR)
        return done(outcome, f"the verifier wrote no reward: {why} (verifier "
                    f"{checked.status.value}, exit {checked.exit_code})", **status)
    reward = rewards.get("reward", sum(rewards.values()) / len(rewards))
    if ran.status is not ExecStatus.OK and reward < 1.0:
        outcome = _STATUS_OUTCOME.get(ran.status, Outcome.FAILED)
    else:
        outcome = Outcome.PASSED if reward >= 1.0 else Outcome.FAILED
    return done(outcome, f"reward {reward:g}" + (f" (the answer's run: {_why(ran)})"
                                                  if ran.status is not ExecStatus.OK else ""),
                reward=reward, rewards=rewards, **status)


# Then, in the same run: every git directory the answer left under /app (any directory
# holding HEAD, or objects and refs: a `.git`, a `--separate-git-dir`, a bare repository,
# a worktree's common dir) gets its `config` and `config.worktree` rewritten to the
# plain settings in GIT_KEEP. git reads a repository's own configuration with the same
# trust as the user's: core.fsmonitor, diff.external, a textconv or filter driver,
# core.pager, core.hooksPath, an include.path, aliases... run commands *as the verifier*
# and others change what its git reports (status.showUntrackedFiles). Keeping a short
# list of known-plain settings instead of refusing known-bad ones closes the class:
# whatever git adds next is dropped too. The file is parsed by git itself (`--no-includes`,
# no system or global configuration); a file git cannot parse is left (git refuses the
# repository: nothing of it runs), one that is no plain file or over 1 MiB is emptied, and
# a worktree's common dir (its `commondir`, where git reads `config`) is taken too. One
# line "G <path>: <dropped keys>" per rewritten file.
GIT_KEEP = (r"core\.(repositoryformatversion|bare|filemode|logallrefupdates|ignorecase|"
            r"precomposeunicode|symlinks)|extensions\.objectformat|"
            r"remote\..+\.(url|pushurl|fetch)|branch\..+\.(remote|merge)|user\.(name|email)")
_GIT_TAMING = f"KEEP = {GIT_KEEP!r}\n" + r"""
import re, shutil
git = shutil.which("git", path="/usr/local/bin:/usr/bin:/bin")
def quoted(v):
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
        .replace("\t", "\\t") + '"'
FORCED = "[core]\n\thooksPath = " + quoted(HOME + "/no-hooks") + "\n\tfsmonitor = false\n"
def write(path, text):
    d = os.path.dirname(path)
    if not os.access(d, os.W_OK | os.X_OK):  # the answer's files are the verifier's own
        os.chmod(d, os.stat(d).st_mode | 0o700)
    tmp = path + ".trialbox-tmp"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    os.replace(tmp, path)
def tame(path, forced):
    if os.path.isdir(path) and not os.path.islink(path):
        return  # git cannot read a directory as its config: it refuses the repository
    if not os.path.lexists(path):
        if forced:
            write(path, forced)
        return
    if not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
        # a fifo, a link to a device, a huge file: git would block or read forever
        os.remove(path)
        write(path, forced)
        print("G " + json.dumps(path[len("/workspace"):]) + ": dropped " +
              "not a plain file of at most 1 MiB")
        return
    r = subprocess.run([git, "config", "--file", path, "--no-includes", "--null", "--list"],
                       capture_output=True, env={"HOME": HOME, "GIT_CONFIG_NOSYSTEM": "1",
                                                 "PATH": "/usr/bin:/bin"})
    if r.returncode != 0:
        return  # git cannot parse it: git refuses the repository, runs nothing from it
    items = []
    for item in r.stdout.split(b"\0"):
        if item:
            k, _, v = item.decode("utf-8", "surrogateescape").partition("\n")
            items.append((k, v))
    kept = [(k, v) for k, v in items if re.fullmatch(KEEP, k)]
    dropped = sorted({k for k, _ in items} - {k for k, _ in kept})
    text = []
    for k, v in kept:
        section, _, rest = k.partition(".")
        sub, _, name = rest.rpartition(".")
        head = f"[{section} {quoted(sub)}]" if sub else f"[{section}]"
        text.append(f"{head}\n\t{name} = {quoted(v)}\n")
    write(path, "".join(text) + forced)
    if dropped:
        print("G " + json.dumps(path[len("/workspace"):]) + ": dropped " +
              ", ".join(dropped[:8]))
# Every git directory's own config also turns hooks and fsmonitor off itself: a verifier
# that clears its environment (env -i) before git loses GIT_CONFIG_COUNT, not this.
for d in sorted(gitdirs) if git else ():
    tame(os.path.join(d, "config"), FORCED)
    tame(os.path.join(d, "config.worktree"), "")
"""

VERIFIER_HOME = "/tmp/verifier-home"
"""The verifier's HOME: a directory of its own session, never /app."""


def _trusted_settings(task_env: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """What the verifier's tools read their per-user settings from, made the verifier's.

    In the agent's session HOME is /app, so the answer can leave there anything a tool
    reads from HOME: Python's user site (`.pth` files and usercustomize run in every
    Python, pytest plugins load from it), `~/.local/bin/env` (sourced by uv-installing
    test scripts), `~/.bash_profile` and `~/.profile` (login shells), `~/.gitconfig`,
    `~/.npmrc`, `~/.config/...`. The verifier gets an empty HOME in its own /tmp and no
    user site; a task that sets HOME or PYTHONNOUSERSITE in [verifier] env keeps its
    choice (it then trusts the answer's files, as with PYTHONPATH=/app). git runs no
    hooks (core.hooksPath, on the command line's level, beats the repository's) and no
    fsmonitor; the repository's own configuration is rewritten by the scan (GIT_KEEP)."""
    out = {"HOME": task_env.get("HOME", VERIFIER_HOME),
           "PYTHONNOUSERSITE": task_env.get("PYTHONNOUSERSITE", "1")}
    pairs = [("core.hooksPath", VERIFIER_HOME + "/no-hooks"), ("core.fsmonitor", "false")]
    try:
        n = int(env.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        n = 0
    for i, (k, v) in enumerate(pairs, n):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = k, v
    out["GIT_CONFIG_COUNT"] = str(n + len(pairs))
    return out


# Run in the verifier's session once /app and /tests are unpacked, before the verifier:
# every symbolic link under /workspace is resolved the way the kernel would (link by
# link, `..` after a link from where the link led), and one that leads, on the way or
# at the end, into /tmp (where /tests, /logs and /solution lie), into /proc (whose magic
# links lead wherever the reading process stands: /proc/self/cwd, /dev/fd) or to / is
# printed. A link the answer planted can then never hand the verifier its own files
# as the answer's, whichever path spells them. Iterative: no depth limit of Python's.
_LINK_SCAN = f"HOME = {VERIFIER_HOME!r}\n" + r"""
import json, os, stat, subprocess, sys
def bad(p, final):
    return (final and p == "/") or any(p == b or p.startswith(b + "/") for b in ("/tmp", "/proc"))
def leads_astray(cur, target):
    todo, hops = target.split("/")[::-1], 0
    if target.startswith("/"):
        cur = "/"
    while todo:
        c = todo.pop()
        if c in ("", "."):
            continue
        if c == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, c)
        if bad(nxt, False):
            return True
        try:
            st = os.lstat(nxt)
        except OSError:
            return bad(os.path.normpath("/".join([nxt] + todo[::-1])), True)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > 40:
                return False  # a loop: the kernel follows it nowhere (ELOOP)
            t = os.readlink(nxt)
            todo.extend(t.split("/")[::-1])
            if t.startswith("/"):
                cur = "/"
        else:
            cur = nxt
    return bad(cur, True)
os.makedirs(HOME + "/.config", exist_ok=True)
found, stack, gitdirs = 0, ["/workspace"], set()
while stack and found < 20:
    d = stack.pop()
    with os.scandir(d) as it:
        entries = list(it)
    names = {e.name: e for e in entries}
    if "HEAD" in names and ("commondir" in names or all(
            n in names and names[n].is_dir() for n in ("objects", "refs"))):
        gitdirs.add(d)  # what git itself takes for a git directory
        if "commondir" in names:  # a worktree's: git reads `config` from its common dir
            try:
                with open(os.path.join(d, "commondir"), "rb") as f:
                    target = f.read(4096).decode("utf-8", "surrogateescape").strip()
                common = os.path.realpath(os.path.join(d, target))
                if common.startswith("/workspace/"):
                    gitdirs.add(common)
            except (OSError, ValueError):
                pass
    for e in entries:
        if e.is_symlink():
            t = os.readlink(e.path)
            if leads_astray(d, t):
                print("L " + json.dumps(e.path[len("/workspace"):]) + " -> " + json.dumps(t))
                found += 1
        elif e.is_dir(follow_symlinks=False):
            stack.append(e.path)
""" + _GIT_TAMING



def _setup_outcome(r: ExecResult) -> Outcome:
    """A trusted step (archiving /app, unpacking it or the tests) that did not finish.
    It may be the answer's doing (a full disk, an unreadable directory it made) or the
    machinery's: ERROR here, and `judge_harbor`'s control decides which."""
    return Outcome.ERROR


def _why(r: ExecResult) -> str:
    if r.status is ExecStatus.OK and r.exit_code:
        return f"exit {r.exit_code}: " + r.stderr[-300:].decode("utf-8", "replace").strip()
    return f"{r.status.value}: {r.message or r.stderr[-300:].decode('utf-8', 'replace')}"


def _tar(files: Sequence[tuple[str, bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path, data, mode in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _untar(sb: Sandbox, where: str, data: bytes, env: dict[str, str]) -> ExecResult:
    return await sb.exec(["bash", "-c", f"mkdir -p {where} && tar -x --no-same-owner "
                          f"--no-same-permissions -C {where}"], stdin=data, env=env,
                         limits=replace(sb.limits, wall_s=60))


async def _read_reward(sb: Sandbox) -> tuple[dict[str, float] | None, str]:
    """The verifier's reward, read by a run of its own: reward.json, else reward.txt."""
    small = replace(sb.limits, wall_s=10, output_bytes=1 << 16)
    for name in ("reward.json", "reward.txt"):
        r = await sb.exec(["cat", f"/tmp/logs/verifier/{name}"], limits=small)
        if r.status is not ExecStatus.OK or r.exit_code != 0:
            continue
        text = r.stdout.decode("utf-8", "replace").strip()
        if name == "reward.txt":
            value = _number(text)
            return ({"reward": value}, "") if value is not None else \
                (None, f"reward.txt holds {text[:60]!r}, not a finite number")
        try:
            data = json.loads(text)
        except ValueError:
            return None, f"reward.json is not JSON: {text[:60]!r}"
        if not isinstance(data, dict) or not data:
            return None, "reward.json must be an object of named numbers"
        out = {str(k): _number(v) for k, v in data.items()}
        bad = [k for k, v in out.items() if v is None]
        if bad:
            return None, f"reward.json: {', '.join(bad[:5])} not finite numbers"
        return {k: v for k, v in out.items() if v is not None}, ""
    return None, "neither /logs/verifier/reward.json nor reward.txt exists"


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


async def run_harbor(tasks: Sequence[HarborTask], answers: dict[str, str] | None,
                     provider: SandboxProvider, *, workers: int = 2,
                     limits: Limits | None = None) -> list[dict[str, Any]]:
    """Grade every task: with `answers` (task id -> script), else each task's oracle.
    Tasks whose environment cannot be provided, or that have no answer, get a row saying
    so (outcome "unsupported" / "no-answer") and the rest run."""
    import asyncio

    slots = asyncio.Semaphore(max(1, workers))

    async def one(task: HarborTask) -> dict[str, Any]:
        base = {"task_id": task.task_id, "notes": list(task.notes)}
        if task.unsupported:
            return {**base, "outcome": "unsupported", "passed": False, "reward": None,
                    "message": task.unsupported}
        oracle = answers is None
        if oracle and not task.has_solution:
            return {**base, "outcome": "no-answer", "passed": False, "reward": None,
                    "message": "the task has no solution/solve.sh to run as the oracle"}
        answer = task.oracle if oracle else (answers or {}).get(task.task_id)
        if answer is None:
            return {**base, "outcome": "no-answer", "passed": False, "reward": None,
                    "message": "no answer for this task in the answers given"}
        if limits is not None:
            task = replace(task, agent_limits=limits, verifier_limits=limits)
        async with slots:
            result = await judge_harbor(task, answer, provider, oracle_env=oracle)
        return {**base, **result.row()}

    return list(await asyncio.gather(*(one(t) for t in tasks)))


# --------------------------------------------------------------------------- the CLI

def add_parser(sub: Any) -> None:
    """`trialbox harbor DIR [--answers FILE] [--tier T] [--json]`."""
    p = sub.add_parser("harbor", help="run and grade Harbor-style task directories "
                       "(task.toml, instruction.md, tests/, solution/)")
    p.add_argument("path", help="a task directory, or a data set directory of them")
    p.add_argument("--answers", default=None,
                   help="JSONL of {task_id, answer} (a bash script run in /app); default: "
                   "each task's oracle, solution/solve.sh")
    p.add_argument("--tier", default="namespace", choices=("namespace", "gvisor", "container"),
                   help="the isolation tier both the answer and the verifier run in")
    p.add_argument("--workers", type=int, default=2, help="tasks graded at once")
    p.add_argument("--json", action="store_true", help="one JSON row per task")
    p.set_defaults(handler=_main)


def _main(args: Any) -> int:
    import asyncio

    from trialbox.sandbox.tiers import _default_factory
    from trialbox.store.harbor import load_harbor

    tasks = load_harbor(args.path)
    answers = _read_answers(args.answers) if args.answers else None

    async def go() -> list[dict[str, Any]]:
        provider = _default_factory(args.tier)
        await provider.start()
        try:
            return await run_harbor(tasks, answers, provider, workers=args.workers)
        finally:
            await provider.close()

    rows = asyncio.run(go())
    for r in rows:
        if args.json:
            print(json.dumps(r))
        else:
            reward = "-" if r.get("reward") is None else f"{r['reward']:g}"
            print(f"{r['task_id']:<40} {r['outcome']:<12} reward {reward:<6} "
                  f"{str(r.get('message', ''))[:100]}")
            for note in r.get("notes", []):
                print(f"{'':<40} note: {note}")
    graded = [r for r in rows if r["outcome"] not in ("unsupported", "no-answer")]
    passed = sum(r["outcome"] == "passed" for r in graded)
    if not args.json:
        print(f"{passed}/{len(graded)} passed; {len(rows) - len(graded)} not run "
              "(unsupported environment or no answer)")
    return 0


def _read_answers(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise UsageError(f"{path}:{n}: not JSON: {e}") from None
            if not isinstance(row, dict) or not isinstance(row.get("task_id"), str) \
                    or not isinstance(row.get("answer"), str):
                raise UsageError(f"{path}:{n}: each line must be {{\"task_id\": str, "
                                 "\"answer\": str (a bash script)}}")
            out[row["task_id"]] = row["answer"]
    return out
