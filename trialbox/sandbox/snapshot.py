"""Snapshots and forks of namespace-tier sessions (docs/snapshots.md).

A session's state is its files: processes end with every run, so the workspace, /tmp
and /dev/shm are all there is to keep. `await sb.snapshot()` freezes them in place and
`await snap.fork(n)` gives `n` sessions that start from them, each on a copy-on-write
overlay, so neither costs more with a bigger workspace:

    async with await pool.open(limits) as sb:
        await sb.write_file("repo/setup.py", ...)            # the expensive set-up
        await sb.exec(["python3", "-m", "pip", ...])
        async with await sb.snapshot() as snap:             # ~1-3 ms, any size
            forks = await snap.fork(8)                      # ~1 ms each, any size
    # the forks outlive the parent session and the snapshot; close each when done

How (all detached mounts, held as fds: nothing of a snapshot has a host path):

    Layer    a frozen filesystem: the session's own tmpfs (or a fork's upper) made
             read-only at the superblock (every mount of it, the cell's included)
    fork     overlay: lower = the snapshot's layers (top first), each seen through an
             idmapped mount that shows its owner's uid as the fork's own; upper = a
             fresh tmpfs of `disk_mb` (what the fork writes, and all it may write)
    parent   after a snapshot it carries on the same way: a fresh upper over the
             layers it just froze

Snapshots serialise to an artifact store (`save`/`load`, the format in
snapshot_archive.py): one `.tar.zst` of the flattened layers and a `.json` of metadata
with the archive's sha256, checked before anything is extracted.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trialbox.errors import SandboxStartError, UsageError
from trialbox.sandbox import mounts
from trialbox.sandbox import snapshot_archive as archive
from trialbox.types import Limits

if TYPE_CHECKING:
    from trialbox.sandbox.namespace import NamespaceSandbox
    from trialbox.sandbox.pool import CellPool
    from trialbox.store.artifacts import ArtifactStore

MAX_LAYERS = 100
"""Frozen layers one session may stand on (each snapshot of a fork adds one; overlayfs
takes 500, but every lookup of a missing name walks them all)."""
FREEZE_WAIT_S = 1.0
"""How long a snapshot waits for files still open for writing (only a descriptor kept
alive past its run holds one) before it gives up."""
OVERLAY_OPTIONS: list[tuple[str, str | int | None]] = [
    ("redirect_dir", "on"),  # renaming a directory from a lower layer works (not EXDEV)
    ("index", "off"), ("metacopy", "off"), ("xino", "off")]


# --------------------------------------------------------------------------- layers

class Layer:
    """One frozen, read-only filesystem: a detached mount held by `fd`, whose files are
    owned by `owner` (the session that wrote them). Reference-counted: snapshots and
    the sessions standing on it each hold one; the fd closes with the last (or when
    the object is collected), and the kernel frees the memory once no overlay uses it."""

    def __init__(self, fd: int, owner: int, used_bytes: int):
        self.fd, self.owner, self.used_bytes = fd, owner, used_bytes
        self.refs = 1
        self._close = weakref.finalize(self, _close_quietly, fd)

    def acquire(self) -> Layer:
        if self.refs <= 0:
            raise UsageError("this snapshot layer was already released")
        self.refs += 1
        return self

    def release(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            self._close()


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _used_bytes(fd: int) -> int:
    st = os.fstatvfs(fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def mount_fork(path: str, layers: list[Layer], uid: int, size_bytes: int,
               inodes: int) -> int:
    """Mount at host `path` an overlay of `layers` (top first) under a fresh tmpfs of
    `size_bytes` and `inodes` for what the session writes; return that tmpfs (a
    detached mount fd the session keeps: a later snapshot freezes it). Each layer owned
    by another uid is seen through an idmapped mount showing its files as `uid`'s, so
    the session may change them (the overlay copies them up first)."""
    upper = mounts.new_mount("tmpfs", [("size", str(size_bytes)), ("nr_inodes", str(inodes)),
                                       ("mode", "755")])
    opened: list[int] = []
    try:
        base = f"/proc/self/fd/{upper}"
        os.mkdir(f"{base}/u", 0o755)
        os.mkdir(f"{base}/w", 0o700)
        flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        u = os.open(f"{base}/u", flags)
        opened.append(u)
        w = os.open(f"{base}/w", flags)
        opened.append(w)
        userns: dict[int, int] = {}
        lowers = []
        for layer in layers:
            if layer.owner == uid:
                lowers.append(layer.fd)
                continue
            if layer.owner not in userns:
                userns[layer.owner] = mounts.idmap_userns(layer.owner, uid)
                opened.append(userns[layer.owner])
            view = mounts.clone_mount(layer.fd)
            opened.append(view)
            mounts.set_mount_attrs(view, mounts.MOUNT_ATTR_IDMAP, userns[layer.owner])
            lowers.append(view)
        options: list[tuple[str, str | int | None]] = [("lowerdir+", fd) for fd in lowers]
        options += [("upperdir", u), ("workdir", w)] + OVERLAY_OPTIONS
        overlay = mounts.new_mount("overlay", options)
        opened.append(overlay)
        mounts.attach_mount(overlay, path)
    except BaseException:
        os.close(upper)
        raise
    finally:
        for fd in opened:  # the overlay holds its own references to its layers
            os.close(fd)
    return upper


async def freeze(sb: NamespaceSandbox) -> Layer:
    """Make the session's writable filesystem a Layer and put the session on a fresh
    upper over it. The caller holds the session's lock; the session holds no cell (its
    cell was destroyed: the frozen pages stay charged to that cell's cgroup, and a
    recycled cell must not start its next session holding them)."""
    if sb.upper >= 0:
        src = mounts.clone_mount(sb.upper, "u")
    else:
        src = mounts.open_tree_clone(sb.dir)
    try:
        deadline = time.monotonic() + FREEZE_WAIT_S
        while True:
            try:
                if sb.upper >= 0:
                    mounts.freeze_superblock(sb.upper)
                else:
                    mounts.freeze_superblock(path=sb.dir)
                break
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise SandboxStartError(
                        f"could not freeze the session's files: {e} (a file of the "
                        "workspace is still open for writing: a descriptor kept alive "
                        "past its run)") from e
                await asyncio.sleep(0.01)
        mounts.set_mount_attrs(src, mounts.MOUNT_ATTR_RDONLY | mounts.MOUNT_ATTR_NOSUID |
                               mounts.MOUNT_ATTR_NODEV)
        layer = Layer(src, sb.uid, _used_bytes(src))
    except BaseException:
        os.close(src)
        raise
    return layer


# ------------------------------------------------------------------------ snapshots

class Snapshot:
    """A session's files, frozen: the state N forks start from. Every fork is an
    independent session (its own cell, uid, namespaces, cgroup and `disk_mb` of
    writes); they outlive the session the snapshot came from and the snapshot itself.

        snap = await sb.snapshot()
        forks = await snap.fork(8)                         # or: await snap.open(limits)
        rollout(policy, [task], group_size=8, leaser=DirectLeaser(snap.open))  # GRPO
        await snap.save(store, "runs/r1/prepared")         # another machine: load()
        await snap.close()                                 # forks keep what they use
    """

    tier = "namespace"

    def __init__(self, pool: CellPool, layers: list[Layer], limits: Limits,
                 snapshot_id: str | None = None):
        self.pool = pool
        self.layers = layers
        """The frozen layers, top first; this snapshot holds a reference on each."""
        self.limits = limits
        """The limits forks get when they ask for none (the source session's)."""
        self.id = snapshot_id or uuid.uuid4().hex[:12]
        self.closed = False

    @property
    def used_bytes(self) -> int:
        """Bytes the layers hold (pages in use; an upper layer counts its copy-ups)."""
        return sum(layer.used_bytes for layer in self.layers)

    def _check_open(self) -> None:
        if self.closed:
            raise UsageError(f"snapshot {self.id} is closed; take a new one (or fork "
                             "before closing it)")

    async def open(self, limits: Limits | None = None,
                   pool: CellPool | None = None) -> NamespaceSandbox:
        """A new session starting from this snapshot (`limits`: the snapshot's when
        None; `disk_mb` bounds what the fork writes on top of it)."""
        from trialbox.sandbox.namespace import NamespaceSandbox
        self._check_open()
        return await NamespaceSandbox.open(pool or self.pool, limits or self.limits,
                                           base=self.layers)

    async def fork(self, n: int, limits: Limits | None = None) -> list[NamespaceSandbox]:
        """`n` independent sessions starting from this snapshot."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UsageError(f"fork: n must be an int >= 1, got {n!r}")
        self._check_open()
        forks: list[NamespaceSandbox] = []
        try:
            for _ in range(n):
                forks.append(await self.open(limits))
        except BaseException:
            for sb in forks:
                await sb.close()
            raise
        return forks

    async def close(self) -> None:
        """Release the snapshot's layers (idempotent). Open forks keep theirs."""
        if self.closed:
            return
        self.closed = True
        for layer in self.layers:
            layer.release()
        self.layers = []

    async def __aenter__(self) -> Snapshot:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ the store
    async def save(self, store: ArtifactStore, name: str) -> dict[str, Any]:
        """Write the snapshot to `store` as `<name>.tar.zst` (its layers flattened into
        one tree) and `<name>.json` (format, sha256 and size of the archive, files,
        bytes, the source limits); returns the metadata. `Snapshot.load` restores it on
        any machine with a namespace-tier pool."""
        self._check_open()
        layer_fds = [layer.fd for layer in self.layers]
        meta = await asyncio.to_thread(archive.save_layers, store, name, layer_fds)
        meta.update(format=archive.FORMAT, id=self.id, layers=len(layer_fds),
                    limits=_limits_dict(self.limits), runtime=self.pool.runtime.id)
        store.put(f"{name}.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        return meta

    @classmethod
    async def load(cls, pool: CellPool, store: ArtifactStore, name: str,
                   max_mb: int = 4096) -> Snapshot:
        """The snapshot `save` wrote as `name`: one frozen layer, its files owned by
        `RESTORED_OWNER` (no session ever runs as that uid; forks see them as theirs).
        The archive is checked against the metadata's sha256 before anything is
        extracted; `max_mb` bounds what it may unpack to."""
        try:
            meta = json.loads(store.get(f"{name}.json"))
        except ValueError as e:
            raise UsageError(f"snapshot metadata {name}.json is not JSON: {e}") from e
        if not isinstance(meta, dict) or meta.get("format") != archive.FORMAT:
            raise UsageError(f"{name}.json is not a trialbox snapshot ({archive.FORMAT}); save "
                             "it with Snapshot.save")
        for key in ("tmpfs_bytes", "entries"):
            if type(meta.get(key)) is not int or meta[key] < 0:
                raise UsageError(f"{name}.json: {key} must be a count, got "
                                 f"{meta.get(key)!r}; save the snapshot again")
        if meta["tmpfs_bytes"] > max_mb << 20:
            raise UsageError(f"snapshot {name} unpacks to {meta['tmpfs_bytes'] >> 20} MiB, "
                             f"above max_mb={max_mb}; raise max_mb to load it")
        owner = restored_owner(pool)
        fd = await asyncio.to_thread(archive.load_tree, store, name, meta, owner)
        layer = Layer(fd, owner, _used_bytes(fd))
        limits = Limits(**meta["limits"]) if meta.get("limits") else Limits()
        return cls(pool, [layer], limits, snapshot_id=str(meta.get("id") or "") or None)


def restored_owner(pool: CellPool) -> int:
    """The uid owning a loaded snapshot's files: just below the node's grid of session
    uids (uids.py), so no session ever runs as it."""
    from trialbox.sandbox.uids import NODE_BASE
    return NODE_BASE - 1


def _limits_dict(limits: Limits) -> dict[str, Any]:
    from dataclasses import asdict
    return asdict(limits)


async def take(sb: NamespaceSandbox) -> Snapshot:
    """`sb.snapshot()`: freeze the session's files (after any run in flight) and
    continue the session on a fresh upper over them."""
    if sb.closed:
        raise UsageError("cannot snapshot a closed session: take the snapshot before "
                         "close(), or fork from a snapshot taken earlier")
    async with sb._lock:
        if sb.closed:
            raise UsageError("cannot snapshot a closed session: take the snapshot before "
                             "close(), or fork from a snapshot taken earlier")
        if len(sb.layers) >= MAX_LAYERS:
            raise UsageError(f"this session already stands on {len(sb.layers)} frozen "
                             f"layers (at most {MAX_LAYERS}); save() a snapshot and load() "
                             "it to flatten them into one")
        sb._drop_cell()  # destroyed, not recycled: see freeze()
        layer = await freeze(sb)
        layers = [layer] + sb.layers  # the session's references move to the new list
        try:
            mounts.umount(sb.dir)
            upper = mount_fork(sb.dir, layers, sb.uid, sb.limits.disk_bytes,
                               _inodes(sb.limits))
        except OSError as e:
            sb.layers = layers
            await sb.close()
            raise SandboxStartError(f"could not remount the session over its "
                                    f"snapshot: {e}") from e
        if sb.upper >= 0:
            os.close(sb.upper)
        sb.upper, sb.layers = upper, layers
        return Snapshot(sb.pool, [la.acquire() for la in layers], sb.limits)


def _inodes(limits: Limits) -> int:
    from trialbox.sandbox.namespace import session_inodes
    return session_inodes(limits)


# ------------------------------------------- one checked-out tree, many candidates

def tree_changes(base: Mapping[str, bytes],
                 tree: Mapping[str, bytes]) -> dict[str, bytes | None]:
    """What turns the tree `base` into `tree`: changed and new files with their bytes,
    removed ones as None (what a candidate's diff did to the checked-out tree)."""
    changes: dict[str, bytes | None] = {p: d for p, d in tree.items() if base.get(p) != d}
    changes.update({p: None for p in base if p not in tree})
    return changes


async def apply_changes(sb: NamespaceSandbox, changes: Mapping[str, bytes | None],
                        under: str = "") -> int:
    """Write `changes` (tree_changes) into a session under the workspace directory
    `under`; None removes the file, and a directory a removal leaves empty goes too (a
    tree is its files: a copy of `tree` would not have it, and an empty directory still
    imports as a namespace package). Only these files are written: on a fork of a
    checked-out tree, the rest is never copied. Returns the bytes written."""
    written = 0
    emptied: set[tuple[str, ...]] = set()
    for path, data in sorted(changes.items()):
        full = f"{under}/{path}" if under else path
        if data is None:
            rel = mounts._parts(path)
            emptied.update(tuple(rel[:i]) for i in range(1, len(rel)))
            sb._check_open()
            parts = mounts._parts(full)
            try:
                dfd = mounts._open_dir_chain(sb.workspace, parts[:-1], False, sb.uid)
            except FileNotFoundError:
                continue
            try:
                os.unlink(parts[-1], dir_fd=dfd)
            except FileNotFoundError:
                pass
            except IsADirectoryError as e:
                raise mounts.PathObstructed(f"{full!r} is a directory in the workspace; "
                                            "a removal takes files only") from e
            finally:
                os.close(dfd)
        else:
            await sb.write_file(full, data)
            written += len(data)
    for rel_dir in sorted(emptied, key=len, reverse=True):  # deepest first
        parts = mounts._parts(under) if under else []
        parts += list(rel_dir)
        try:
            dfd = mounts._open_dir_chain(sb.workspace, parts[:-1], False, sb.uid)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            os.rmdir(parts[-1], dir_fd=dfd)
        except OSError as e:  # still holds files (or is not there): it stays
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.ENOTDIR):
                raise
        finally:
            os.close(dfd)
    return written


class TreeSnapshots:
    """Snapshots of checked-out trees, one per distinct tree (by content hash), so N
    candidates of one repository task run against one tree without copying it N times:

        trees = TreeSnapshots(pool)
        sb = await trees.open(task_files, under="repo", limits=limits)   # a fork
        await apply_changes(sb, tree_changes(task_files, candidate_files), under="repo")

    The first `open` of a tree writes it into a session and snapshots it; later ones
    fork that snapshot (~1 ms, whatever the tree's size). `close()` releases them all
    (open forks live on). At most `max_trees` are kept, holding at most `max_bytes` of
    frozen files (None: no bound) beyond the newest one (least recently used first out)."""

    def __init__(self, pool: CellPool, max_trees: int = 16, max_bytes: int | None = None):
        if max_trees < 1:
            raise UsageError("TreeSnapshots: max_trees must be >= 1")
        if max_bytes is not None and max_bytes < 1:
            raise UsageError("TreeSnapshots: max_bytes must be None or >= 1")
        self.pool, self.max_trees, self.max_bytes = pool, max_trees, max_bytes
        self._snaps: dict[str, Snapshot] = {}
        self._making: dict[str, asyncio.Lock] = {}
        self.made = 0
        """Trees written and snapshotted (the rest of the opens were forks)."""

    @staticmethod
    def key(files: Mapping[str, bytes], under: str) -> str:
        h = hashlib.sha256(under.encode() + b"\0")
        for path in sorted(files):
            h.update(path.encode("utf-8", "surrogateescape") + b"\0")
            h.update(hashlib.sha256(files[path]).digest())
        return h.hexdigest()

    async def snapshot(self, files: Mapping[str, bytes], under: str = "",
                       limits: Limits | None = None, key: str | None = None) -> Snapshot:
        """The snapshot of this tree (made at the first call). `key`: the tree's
        `key(files, under)` when the caller already knows it (hashing a big tree at
        every open would cost more than the fork)."""
        key = key or self.key(files, under)
        async with self._making.setdefault(key, asyncio.Lock()):
            snap = self._snaps.pop(key, None)
            if snap is None:
                async with await self.pool.open(limits) as sb:
                    for path, data in sorted(files.items()):
                        await sb.write_file(f"{under}/{path}" if under else path, data)
                    snap = await sb.snapshot()
                self.made += 1
            self._snaps[key] = snap  # most recently used last
            while len(self._snaps) > self.max_trees or (
                    self.max_bytes is not None and len(self._snaps) > 1 and
                    sum(s.used_bytes for s in self._snaps.values()) > self.max_bytes):
                old = next(iter(self._snaps))
                await self._snaps.pop(old).close()
                self._making.pop(old, None)
            return snap

    async def open(self, files: Mapping[str, bytes], under: str = "",
                   limits: Limits | None = None, key: str | None = None,
                   fork_limits: Limits | None = None) -> NamespaceSandbox:
        """A new session holding this tree under `under` (a fork of its snapshot, with
        `fork_limits`, default `limits`; `limits` are those of the session the tree
        is first written into)."""
        snap = await self.snapshot(files, under, limits, key)
        # Our own references, taken before anything can await: a concurrent open of
        # another tree may evict (close) `snap` while this fork is being made.
        mine = Snapshot(snap.pool, [la.acquire() for la in snap.layers], snap.limits)
        try:
            return await mine.open(fork_limits or limits)
        finally:
            await mine.close()

    async def close(self) -> None:
        for snap in self._snaps.values():
            await snap.close()
        self._snaps.clear()
        self._making.clear()
