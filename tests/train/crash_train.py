"""`trialbox train` that kills itself (SIGKILL, as `kill -9` would) at a chosen point,
for the crash-and-resume test.

    python -m tests.train.crash_train KILL trialbox-train-arguments...

KILL: `grading:N` (while the judge grades this process's N-th judged turn),
`episode:K` (as soon as this process's K-th episode has journaled its trajectory),
`update:K` (inside this process's K-th update, after the weights changed and before
anything records it), `time:T` (T seconds after the first step is launched), `none`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from typing import Any


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


if __name__ == "__main__":
    install(sys.argv[1])
    from trialbox.cli import main
    rc = main(["train", *sys.argv[2:]])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # the run is over and its files closed: skip the interpreter's
    # seconds-long teardown of torch (this test starts six of these processes)
