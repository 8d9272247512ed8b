"""Host uids for sandboxes: unique on the node, across processes, and crash-safe.

Every session runs as a host uid of its own, and per-user kernel budgets (pipe pages,
inotify instances, POSIX queues, RLIMIT_NPROC) are charged to it: two sessions that
share a uid share those budgets, and one can shrink the other's. A pool hands out uids
only from blocks it leased here, so no two pools on a node — in one process or in
several (reward workers, a service beside a trainer) — ever hand out the same one.

The node's sandbox uids are a grid of blocks of `BLOCK` uids from `NODE_BASE`::

    NODE_BASE          +BLOCK             +2*BLOCK
    | block 0 (pool A) | block 1 (pool B) | block 2 (free) | ...

A holder leases whole blocks: it holds an exclusive `flock` on one file per block,
`<LEASE_DIR>/<first uid>`, for as long as it lives (a non-blocking try; a held block is
skipped). A holder that dies, even by SIGKILL, loses its locks in the kernel: its
blocks are free again without anyone cleaning up. Its sandboxes die by the parent-death
chain, not in the same instant, so a new holder skips such a block while any process
still runs under one of its uids. Each file says whether its last holder gave it back
(`free`) or died holding it (`held`): only the latter costs a scan of /proc (~5-15 ms).

`NODE_BASE - 1` owns the files of restored snapshots (snapshot.restored_owner): no
session ever runs as it. Every tier that hands out host uids should lease them here.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from types import TracebackType

from trialbox.errors import SandboxStartError, SandboxUnavailable

NODE_BASE = 2_000_000
"""First uid of the node's grid (above every real user, and of the fixed ranges earlier
versions of both tiers used: 1,000,000 and 1,100,000)."""
BLOCK = 65_536
"""Uids per block: a user namespace's usual range."""
MAX_UID = 1_000_000_000
"""The grid ends below this (15,228 blocks): far below 2**31 (some tools read uids as
signed numbers). The namespace tier leases a block per pool, the container tier one
per session: both from this grid."""
LEASE_DIR = "/run/trialbox-uids"
"""One lock file per block; /run is emptied at boot, when no lease can be alive."""
HELD, FREE = b"held", b"free"
"""What a block's file says: leased (written once locked), or given back by `close()`.
A block whose file says `held` but whose lock is free was held by a process that died."""


class UidLease:
    """Consecutive uids `first .. first + count - 1`, held until `close()` (or the
    holder's death). A context manager; closing twice is harmless."""

    def __init__(self, first: int, count: int, fds: list[int]):
        self.first = first
        self.count = count
        self._fds = fds

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid < self.first + self.count

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.pwrite(fd, FREE, 0)  # given back whole: the next holder need not scan
            os.close(fd)  # the lock goes with the last descriptor of its open file

    def __enter__(self) -> UidLease:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def lease(count: int, lease_dir: str = LEASE_DIR) -> UidLease:
    """Lease the first free run of blocks holding `count` uids (at least one block).

    Raises SandboxStartError when the grid is full (every block held by a live process).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    need = -(-count // BLOCK)
    _ensure_dir(lease_dir)
    n_blocks = (MAX_UID - NODE_BASE) // BLOCK
    b = 0
    while b + need <= n_blocks:
        fds: list[int] = []
        for i in range(b, b + need):
            fd = _try_lock(lease_dir, NODE_BASE + i * BLOCK)
            if fd is None:
                break
            fds.append(fd)
        if len(fds) == need:
            first = NODE_BASE + b * BLOCK
            # Only a block whose last holder died holding it ("held" left in its file)
            # can still have processes running under its uids: scan for those alone.
            crashed = any(os.pread(fd, len(HELD), 0) == HELD for fd in fds)
            if not (crashed and _uids_running(first, need * BLOCK)):
                for fd in fds:
                    os.pwrite(fd, HELD, 0)
                return UidLease(first, need * BLOCK, fds)
        for fd in fds:
            os.close(fd)
        # past the block another holder has; one block on if the run is still in use
        b += len(fds) + 1 if len(fds) < need else 1
    raise SandboxStartError(f"no free block of {need} x {BLOCK} sandbox uids on this node "
                            f"({n_blocks} blocks, all leased by live pools)")


def _ensure_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxUnavailable(f"{path} must belong to this user and be writable by no "
                                 f"one else (anyone who can take its locks can make two "
                                 f"pools share uids)")


def _try_lock(lease_dir: str, first: int) -> int | None:
    fd = os.open(os.path.join(lease_dir, str(first)),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def pids_running_as(first: int, count: int) -> Iterator[int]:
    """Host pids of processes with a real, effective, saved or filesystem uid in the
    range."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if any(first <= int(u) < first + count for u in line.split()[1:]):
                            yield int(name)
                        break
        except OSError:
            continue


def _uids_running(first: int, count: int) -> bool:
    """Whether any process runs in the range (a dead holder's sandboxes, still dying)."""
    return next(pids_running_as(first, count), None) is not None
