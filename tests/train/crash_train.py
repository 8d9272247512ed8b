"""`trialbox train` that kills itself (SIGKILL, as `kill -9` would) at a chosen point,
for the crash-and-resume test.

    python -m tests.train.crash_train KILL trialbox-train-arguments...

KILL: `grading:N` (while the judge grades this process's N-th judged turn),
`episode:K` (as soon as this process's K-th episode has journaled its trajectory),
`update:K` (inside this process's K-th update, after the weights changed and before
anything records it), `time:T` (T seconds after the first step is launched), `none`.

`launcher()` runs the same, each run a process of its own, forked from one that has
imported the trainer: the test's seven runs then pay for importing torch and
transformers (~10 s on two cores) once, not seven times. Nothing runs in the forking
process but those imports, so each child starts as fresh as `python -m` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RUN_TIMEOUT_S = 300
"""A run that has not ended by then is killed (SIGALRM): a hang fails, never waits."""


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(kill: str) -> None:
    what, _, arg = kill.partition(":")
    if what == "grading":
        import trialbox.rollout.agent as agent
        real_judge = agent._judge
        seen = [0]

        async def judge(env: Any, task: Any, completion: str, seed: int | None) -> Any:
            seen[0] += 1
            if seen[0] == int(arg):  # the judge is at work when the process dies
                asyncio.get_running_loop().call_later(0.02, die)
            return await real_judge(env, task, completion, seed)
        agent._judge = judge  # type: ignore[assignment]
    elif what == "update":
        import trialbox.train.trainer as trainer
        real_make = trainer.make_update
        updates = [0]

        def make_update(*a: Any, **kw: Any) -> Any:
            update = real_make(*a, **kw)

            def dying(trajs: Any, step: int) -> Any:
                stats = update(trajs, step)
                updates[0] += 1
                if updates[0] == int(arg):
                    die()
                return stats
            return dying
        trainer.make_update = make_update  # type: ignore[assignment]
    elif what == "episode":
        import trialbox.train.episodes as episodes
        real_job = episodes.JournaledEpisodes._job
        finished = [0]

        async def job(self: Any, ctx: Any) -> Any:
            reward = await real_job(self, ctx)  # its trajectory is journaled now
            finished[0] += 1
            if finished[0] == int(arg):  # its step's other episodes are still running
                die()
            return reward
        episodes.JournaledEpisodes._job = job  # type: ignore[method-assign]
    elif what == "time":
        import trialbox.train.episodes as episodes
        real_rollout = episodes.JournaledEpisodes.rollout
        started = [False]

        async def rollout(self: Any, *a: Any, **kw: Any) -> Any:
            if not started[0]:
                started[0] = True
                threading.Timer(float(arg), die).start()
            return await real_rollout(self, *a, **kw)
        episodes.JournaledEpisodes.rollout = rollout  # type: ignore[method-assign]
    elif what != "none":
        raise SystemExit(f"unknown kill point {kill!r}")


def run(kill: str, args: list[str]) -> None:
    """This process: `trialbox train ARGS`, killed at `kill`; exits with its status."""
    signal.alarm(RUN_TIMEOUT_S)
    install(kill)
    from trialbox.cli import main
    rc = main(["train", *args])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # the run is over and its files closed: skip the interpreter's
    # seconds-long teardown of torch


def serve() -> None:
    """The launcher's process: imports, then one forked run per request on stdin (a JSON
    list: KILL, stdout file, stderr file, train arguments...), answering each with the
    run's exit status on stdout (-9: killed by SIGKILL)."""
    # what `trialbox train` imports (torch, transformers...), imported once, here
    import trialbox.cli
    import trialbox.cli.train
    import trialbox.train.trainer  # noqa: F401
    for line in sys.stdin:
        kill, out, err, *args = json.loads(line)
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            run(kill, args)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


@contextlib.contextmanager
def launcher(tmp: Path, cwd: str) -> Iterator[Callable[[str, list[str]],
                                                       tuple[int, str, str]]]:
    """`run(KILL, train arguments)` -> (exit status, stdout, stderr) of that run in a
    process of its own (see the module's docstring); the launcher ends with the block."""
    server = subprocess.Popen([sys.executable, "-m", "tests.train.crash_train", "--serve"],
                              cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert server.stdin is not None and server.stdout is not None
    runs = [0]

    def run_one(kill: str, args: list[str]) -> tuple[int, str, str]:
        runs[0] += 1
        out, err = tmp / f"run{runs[0]}.out", tmp / f"run{runs[0]}.err"
        server.stdin.write(json.dumps([kill, str(out), str(err), *args]) + "\n")
        server.stdin.flush()
        answer = server.stdout.readline()
        assert answer, f"the launcher died (exit {server.wait()})"
        return int(answer), out.read_text(), err.read_text()
    try:
        yield run_one
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve()
    else:
        run(sys.argv[1], sys.argv[2:])
