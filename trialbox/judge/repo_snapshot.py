"""The repository judge's sessions, forked from a snapshot of the task's tree.

Every attempt of the repository judge needs sessions holding a whole workspace: the
judge's own programs under `_judge/` and the candidate's tree under `repo/` (seen one
way by the tests' sandbox, another by the candidate's; repo.py builds both). Copying
that workspace into every session costs time in the tree's size, N times for N
candidates. On a tier with snapshots (the namespace tier's `CellPool`) the workspace the
*task* starts from — its tree with no answer applied — is written once into a session
nobody runs anything in, snapshotted, and each attempt's session is a fork of it with
only what the answer changed written on top (`apply_changes`):

    ws = open_workspace(pool, limits, base=start_ws, key=start_key, files=cand_ws)
        fork of snapshot(start_ws)   (written and frozen at the task's first attempt)
          + tree_changes(start_ws, cand_ws)     (changed and new files, removals)

What it guarantees, and why verdicts are the copying path's (docs/judge.md):

* **Same contents.** The session holds exactly `files` — the snapshot is of the judge's
  own writes only (no process runs in it), and removals prune the directories they
  empty, as a copy would never have had them.
* **Forks are independent**: each its own cell, uid and upper layer; what one candidate
  writes (before or during its run) no other fork and no snapshot sees.
* **Same room.** A fork's `disk_mb` bounds what it writes on top of the snapshot, so
  the fork gets `disk_mb` less the starting tree's pages (whole MiB): a run has about
  the room it has on the copying path. An answer whose tree comes within
  `HEADROOM` of the limit (where ENOSPC could decide the verdict) takes the copying
  path: so does a tree that does not fit at all, which is the candidate's failure
  either way.
* **Never a verdict of its own making.** A snapshot or fork that fails (InfraError)
  makes that attempt copy; `MAX_FAILURES` in a row turn the path off for the pool
  (`RepoTrees.off` says why: e.g. a kernel without overlay layers given as fds).
* **Bounded, released.** At most `MAX_TREES` snapshots per pool holding `MAX_BYTES`
  (their files are memory), least recently used first out; `release_trees(pool)`
  drops them all (a pool that is collected takes them with it).

Tiers without snapshots (gVisor, containers, fakes, remote providers) take the copying
path: a session per attempt, every file written (`RepoJudgeConfig.snapshots=False`
forces it anywhere, for comparison).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trialbox.errors import CandidateFault, InfraError, UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.sandbox.snapshot import TreeSnapshots, apply_changes, tree_changes
from trialbox.types import Limits

MAX_TREES = 16
"""Snapshots kept per pool (a trusted attempt uses two per task: the tests' view and
the candidate's)."""
MAX_BYTES = 2 << 30
"""Frozen bytes those snapshots may hold together (beyond the newest): they are memory."""
MAX_FAILURES = 3
"""Snapshot machinery failing this many times in a row (e.g. a kernel without overlay
layers given as fds: docs/snapshots.md) turns the snapshot path off for the pool."""
HEADROOM = 1 << 20
"""Trees within this many bytes of `disk_mb` (pages counted) take the copying path."""
PAGE = 4096
MiB = 1 << 20
_ATTR = "_trialbox_repo_trees"


class WorkspaceUnwritable(CandidateFault):
    """The workspace does not fit the session (its `disk_mb` or inodes): the answer's
    doing, graded FAILED by the caller with this message."""


def workspace_key(files: Mapping[str, bytes]) -> str:
    """The content hash a starting workspace's snapshot is cached under."""
    return TreeSnapshots.key(files, "")


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


class RepoTrees:
    """A pool's snapshots of starting workspaces, and counts of how attempts were
    served (for tests and the bench)."""

    def __init__(self, pool: SandboxProvider, max_trees: int = MAX_TREES,
                 max_bytes: int = MAX_BYTES):
        self.trees = TreeSnapshots(pool, max_trees, max_bytes)  # type: ignore[arg-type]
        self.forked = 0
        """Sessions opened as forks (the answer's changes written on top)."""
        self.copied = 0
        """Sessions that took the copying path on this pool (near or past disk_mb)."""
        self._refused: set[str] = set()  # starting workspaces that do not fit a session
        self.failures = 0
        """Snapshot or fork failures in a row (each such attempt copied instead)."""
        self.off: str | None = None
        """Why the snapshot path is off for this pool (None: it is on)."""

    async def open(self, limits: Limits, base: Mapping[str, bytes], key: str,
                   files: Mapping[str, bytes]) -> Sandbox | None:
        """A fork of `base`'s snapshot holding `files`, or None where the copying path
        must serve this session (the caller copies)."""
        base_bytes = sum(_pages(len(d)) for d in base.values())
        room = limits.disk_bytes - HEADROOM
        if self.off is not None or key in self._refused or base_bytes > room \
                or sum(_pages(len(d)) for d in files.values()) > room:
            return None
        changes = tree_changes(base, files)
        # what the fork's upper takes: new contents, plus a copy-up of each file changed
        # in place (transient, but it must fit)
        need = sum(_pages(len(d)) for d in changes.values() if d is not None) + \
            sum(_pages(len(base[p])) for p, d in changes.items() if d is not None and p in base)
        fork_limits = replace(limits, disk_mb=max(1, limits.disk_mb - base_bytes // MiB))
        if need + HEADROOM > fork_limits.disk_bytes:
            return None
        try:
            sb = await self.trees.open(base, "", limits, key, fork_limits)
        except UsageError:  # the starting tree does not fit this session: copy instead
            self._refused.add(key)
            return None
        except InfraError as e:  # the machinery, not the answer: this attempt copies
            self.failures += 1
            if self.failures >= MAX_FAILURES:
                self.off = f"snapshots failed {self.failures} times in a row: {e}"
            return None
        self.failures = 0
        try:
            await apply_changes(sb, changes)
        except UsageError as e:
            await sb.close()
            raise WorkspaceUnwritable(str(e)) from e
        except BaseException:
            await sb.close()
            raise
        self.forked += 1
        return sb

    async def close(self) -> None:
        await self.trees.close()


def snapshots_for(pool: SandboxProvider) -> RepoTrees | None:
    """The pool's `RepoTrees` (made at first use), or None when its tier has no
    snapshots (only the namespace tier's `CellPool` has them)."""
    from trialbox.sandbox.pool import CellPool
    if not isinstance(pool, CellPool) or pool.closed:
        return None
    trees: RepoTrees | None = pool.__dict__.get(_ATTR)
    if trees is None:
        trees = RepoTrees(pool)
        setattr(pool, _ATTR, trees)
    return trees


async def release_trees(pool: SandboxProvider) -> None:
    """Release the pool's snapshots of starting workspaces (open sessions keep theirs)."""
    trees = getattr(pool, "__dict__", {}).pop(_ATTR, None)
    if trees is not None:
        await trees.close()


async def open_workspace(pool: SandboxProvider, limits: Limits, files: Mapping[str, bytes],
                         base: Mapping[str, bytes] | None = None, key: str | None = None,
                         snapshots: bool = True) -> Sandbox:
    """A session holding the workspace `files` (path -> bytes): a fork of `base`'s
    snapshot with the difference written (see the module docstring), or, on a tier
    without snapshots, with `snapshots=False`, or where the fork cannot promise the
    copying path's room, a new session with every file written. Raises
    `WorkspaceUnwritable` when the files do not fit."""
    trees = snapshots_for(pool) if snapshots and base is not None else None
    if trees is not None:
        assert base is not None
        sb = await trees.open(limits, base, key or workspace_key(base), files)
        if sb is not None:
            return sb
        trees.copied += 1
    sb = await pool.open(limits)
    try:
        for path, data in sorted(files.items()):
            await sb.write_file(path, data)
    except UsageError as e:  # e.g. a tree larger than the workspace: its doing
        await sb.close()
        raise WorkspaceUnwritable(str(e)) from e
    except BaseException:
        await sb.close()
        raise
    return sb

