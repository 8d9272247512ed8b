"""A GRPO group from one prepared state (`AgentConfig.prepare`; docs/snapshots.md).

Agent tasks often begin with expensive set-up (a repository written, its dependencies
installed, a build warmed), and a GRPO group samples G episodes from the same start.
With `AgentConfig.prepare` set, `rollout()` runs the set-up once per task, in a session
of its own, snapshots it, and every episode of that task's group opens its session as a
fork of the snapshot (copy-on-write, ~1 ms; what one episode writes no other sees):

    async def prepare(task, sb):                      # once per task and rollout
        await sb.write_file("repo/setup.py", ...)
        r = await sb.exec(["python3", "-m", "pip", "install", "-e", "repo"], ...)
        if r.status is not ExecStatus.OK:
            raise UsageError(f"{task.task_id}: set-up failed: {r.message}")
    batch = await rollout(policy, tasks, group_size=8,
                          config=AgentConfig(prepare=prepare), pool=pool)

On a tier whose sessions have no snapshots (`base.Snapshottable`: the namespace tier
has them), each episode's session runs `prepare` itself when it opens: the same start,
paid G times.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider, SessionSnapshot, Snapshottable
from trialbox.schedule.lease import DirectLeaser, Opener
from trialbox.types import Limits, Task

Prepare = Callable[[Task, Sandbox], Awaitable[None]]
"""Set a session up for a task (write files, run commands); raise to stop the rollout."""


class GroupLeaser:
    """A `Leaser` whose episodes open their sessions from their group's opener: episode
    ids are `<group>/<j>` (and an episode's control, `<group>/<j>/control`), each group a
    `DirectLeaser` of its own. `close()` ends every session and closes the snapshots."""

    def __init__(self, openers: dict[str, Opener], snapshots: Sequence[SessionSnapshot] = ()):
        self.leasers = {g: DirectLeaser(o) for g, o in openers.items()}
        self.snapshots = list(snapshots)
        self.prepared_runs = 0
        """Times `prepare` ran (once per task with snapshots; once per episode without)."""

    def _of(self, episode: str) -> DirectLeaser:
        group = episode.rsplit("/", 2)[0] if episode.endswith("/control") \
            else episode.rsplit("/", 1)[0]
        leaser = self.leasers.get(group)
        if leaser is None:
            raise UsageError(f"episode {episode!r} belongs to no prepared group (groups: "
                             f"{', '.join(sorted(self.leasers))[:200]})")
        return leaser

    def lease(self, episode: str,
              limits: Limits | None = None) -> AbstractAsyncContextManager[Sandbox]:
        return self._of(episode).lease(episode, limits)

    async def end(self, episode: str) -> None:
        await self._of(episode).end(episode)

    async def close(self) -> None:
        for leaser in self.leasers.values():
            await leaser.close()
        for snap in self.snapshots:
            close = getattr(snap, "close", None)
            if close is not None:
                await close()
        self.snapshots = []


async def prepare_groups(provider: SandboxProvider, groups: Sequence[tuple[str, Task]],
                         prepare: Prepare, limits: Limits) -> GroupLeaser:
    """Run `prepare` once per (group id, task) in a fresh session of `limits` and
    snapshot it; the returned leaser opens each group's episodes as forks of its
    snapshot (or, on a tier without snapshots, as new sessions that run `prepare`)."""
    leaser = GroupLeaser({})
    try:
        for group, task in groups:
            sb = await provider.open(limits)
            try:
                if isinstance(sb, Snapshottable):
                    await prepare(task, sb)
                    leaser.prepared_runs += 1
                    snap = await sb.snapshot()
                    leaser.snapshots.append(snap)
                    leaser.leasers[group] = DirectLeaser(snap.open)
                    continue
            finally:
                await sb.close()
            leaser.leasers[group] = DirectLeaser(_preparing(provider, task, prepare, leaser))
    except BaseException:
        await leaser.close()
        raise
    return leaser


def _preparing(provider: SandboxProvider, task: Task, prepare: Prepare,
               leaser: GroupLeaser) -> Opener:
    """An opener for a tier without snapshots: a new session, set up by `prepare`."""
    async def open_prepared(limits: Limits | None) -> Sandbox:
        sb = await provider.open(limits)
        try:
            await prepare(task, sb)
        except BaseException:
            await sb.close()
            raise
        leaser.prepared_runs += 1
        return sb
    return open_prepared
