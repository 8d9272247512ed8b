"""Verifying an image before and while a pool serves it (`ImageGuard`).

* **full** — every byte re-hashed and the manifest compared with the baseline: once when a
  pool starts (before its first cell), every `periodic_s`, and on demand (`full()`,
  `trialbox image verify`).
* **cheap** — before each task: one non-blocking read of an inotify descriptor that
  watches every directory of the image (armed *before* the pool-start full hash, so
  nothing can change between the hash and the watch). The kernel reports a write,
  attribute change, creation, deletion or rename of any entry in a watched directory,
  through whatever path or mount it was made (bind mounts, open descriptors, another
  mount namespace): no event since the full hash means no change since it. One read
  returning EAGAIN costs about a microsecond, whatever the image's size. A queue
  overflow counts as a change. What it cannot see (a write to the raw block device,
  a hard link to an image file made from outside before the watch) the periodic full
  re-hash does. Without a watch (`trialbox image verify --cheap`) the cheap check
  compares each entry's lstat with the seal taken at build (image_manifest.check_seal:
  ~8k entries, ~0.1 s here).

A mismatch in either stops the image: every later task is refused with `ImageMismatch`
naming the files, until a new guard (a pool restart after a rebuild). Checks are
recorded: `counts` per kind and why, `checks` the latest records.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import stat
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass

from trialbox.sandbox import image_manifest as im
from trialbox.sandbox.image import Image, ImageMismatch
from trialbox.types import Runtime

SHOW = 8
"""Differences named in an error (the total is always given)."""

_libc = ctypes.CDLL(None, use_errno=True)
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_DONT_FOLLOW = 0x4000, 0x8000, 0x1000000, 0x2000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_WATCH = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE |
          IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
_WHAT = ((IN_MODIFY, "written"), (IN_ATTRIB, "attributes changed"),
         (IN_CREATE, "added"), (IN_DELETE, "removed"), (IN_MOVED_FROM, "renamed away"),
         (IN_MOVED_TO, "renamed in"), (IN_DELETE_SELF, "removed"),
         (IN_MOVE_SELF, "moved"))


@dataclass(frozen=True)
class CheckRecord:
    """One verification that ran."""

    kind: str
    """`full` (pool start, periodic, on demand) or `cheap` (before a task)."""
    why: str
    """`pool-start`, `periodic`, `on-demand`, `before-task`."""
    at: float
    """time.time() when it started."""
    seconds: float
    differences: int
    """0 when the image matched its baseline."""


def describe(image: Image, diffs: list[im.Difference], kind: str) -> str:
    shown = ", ".join(str(d) for d in diffs[:SHOW])
    more = f" and {len(diffs) - SHOW} more" if len(diffs) > SHOW else ""
    return (f"image {image.id} ({image.dir}) does not match its baseline ({kind} check): "
            f"{len(diffs)} entries differ: {shown}{more}; it will not be used: rebuild it "
            "(`trialbox image build SPEC`) or find what changed it")


class _Watch:
    """inotify watches on every directory under a root (see the module docstring)."""

    def __init__(self, root: str):
        self.root = root
        self.fd = int(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if self.fd < 0:
            e = ctypes.get_errno()
            raise ImageMismatch(f"cannot watch image {root}: inotify_init1: "
                                f"{os.strerror(e)} (raise fs.inotify.max_user_instances)")
        self.dirs: dict[int, str] = {}
        self._add("")
        for rel, st in im.walk(root):
            if stat.S_ISDIR(st.st_mode):
                self._add(rel)

    def _add(self, rel: str) -> None:
        path = os.path.join(self.root, rel) if rel else self.root
        wd = int(_libc.inotify_add_watch(self.fd, path.encode("utf-8", "surrogateescape"),
                                         _WATCH))
        if wd < 0:
            e = ctypes.get_errno()
            os.close(self.fd)
            raise ImageMismatch(f"cannot watch {path}: inotify_add_watch: {os.strerror(e)} "
                                "(raise fs.inotify.max_user_watches)")
        self.dirs[wd] = rel

    def changes(self) -> list[im.Difference]:
        """What happened since the last call (nothing: an empty list, one syscall)."""
        out: list[im.Difference] = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return out
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            off = 0
            while off + 16 <= len(buf):
                wd, mask, _cookie, n = struct.unpack_from("iIII", buf, off)
                name = buf[off + 16:off + 16 + n].split(b"\0", 1)[0].decode(
                    "utf-8", "surrogateescape")
                off += 16 + n
                if mask & IN_Q_OVERFLOW:
                    out.append(im.Difference("(watch)", "too many changes to list "
                                             "(inotify queue overflowed)"))
                    continue
                if mask & IN_IGNORED and not mask & ~IN_IGNORED:
                    continue
                d = self.dirs.get(wd, "?")
                path = f"{d}/{name}" if d and name else (name or d or ".")
                what = ", ".join(w for bit, w in _WHAT if mask & bit) or f"event {mask:#x}"
                out.append(im.Difference(path, what))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ImageGuard:
    """Keeps one image honest for one pool (see the module docstring)."""

    def __init__(self, image: Image, periodic_s: float = 0.0):
        self.image = image
        self.periodic_s = periodic_s
        self.checks: deque[CheckRecord] = deque(maxlen=256)
        """The latest checks (cheap ones are many: see `counts`)."""
        self.counts: dict[str, int] = {}
        """Checks run, by `kind/why`, e.g. `{"full/pool-start": 1, "cheap/before-task":
        164}`."""
        self.cheap_s = 0.0
        """Seconds spent in cheap checks, all together."""
        self.error = ""
        """Set on the first mismatch; from then on every task is refused."""
        self._watch: _Watch | None = None
        self._lock = threading.Lock()
        self._periodic: asyncio.Task[None] | None = None

    def _record(self, kind: str, why: str, at: float, seconds: float, n: int) -> None:
        with self._lock:
            key = f"{kind}/{why}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if kind == "cheap":
                self.cheap_s += seconds
            self.checks.append(CheckRecord(kind, why, at, seconds, n))

    # ------------------------------------------------------------------ checks
    def start(self) -> None:
        """Arm the watch, then hash everything (`full("pool-start")`): what a pool
        runs before its first cell. Raises ImageMismatch."""
        if self._watch is None:
            self._watch = _Watch(self.image.rootfs)
        self.full("pool-start")

    def full(self, why: str = "on-demand") -> list[im.Difference]:
        """Re-hash every byte (blocking); on a mismatch the guard stops the image and
        raises ImageMismatch naming the files."""
        t0, at = time.monotonic(), time.time()
        entries, _seal = im.build_manifest(self.image.rootfs)
        diffs = im.diff(self.image.manifest(), entries)
        if im.content_hash(entries) != self.image.content_hash and not diffs:
            diffs = [im.Difference("(manifest)", "content hash differs")]
        if not diffs and self._watch is not None:
            diffs = self._watch.changes()  # changed and changed back while hashing
        self._record("full", why, at, time.monotonic() - t0, len(diffs))
        if diffs:
            self._stop(diffs, "full")
        return diffs

    def cheap(self) -> list[im.Difference]:
        """The before-task check: what the watch saw since the last check (blocking,
        ~1 us), or the lstat seal when no watch is armed. Stops the image on a change."""
        self.refuse_if_stopped()
        t0, at = time.monotonic(), time.time()
        if self._watch is not None:
            diffs = self._watch.changes()
        else:
            diffs = im.check_seal(self.image.rootfs, self.image.seal())
        self._record("cheap", "before-task", at, time.monotonic() - t0, len(diffs))
        if diffs:
            self._stop(diffs, "cheap")
        return diffs

    def _stop(self, diffs: list[im.Difference], kind: str) -> None:
        with self._lock:
            if not self.error:
                self.error = describe(self.image, diffs, kind)
        raise ImageMismatch(self.error)

    def refuse_if_stopped(self) -> None:
        if self.error:
            raise ImageMismatch(self.error)

    # ------------------------------------------------------------------ async side
    async def before_task(self) -> None:
        """The cheap check for one task; raises ImageMismatch when the image is (or was
        ever) found changed."""
        self.cheap()

    def start_periodic(self) -> None:
        if self.periodic_s > 0 and self._periodic is None:
            self._periodic = asyncio.get_running_loop().create_task(self._every())

    async def _every(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.error:
            await asyncio.sleep(self.periodic_s)
            try:
                await loop.run_in_executor(None, self.full, "periodic")
            except ImageMismatch:
                return

    def close(self) -> None:
        if self._periodic is not None:
            self._periodic.cancel()
            self._periodic = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None


def environment_mismatch(declared: str, runtime: Runtime) -> str:
    """Why a task that declares `declared` (`name@sha256:<hex prefix>`, Task.image) must
    not run on `runtime` (a pool's), or "" when it may."""
    if not declared:
        return ""
    name, _, digest = declared.partition("@sha256:")
    if runtime.name != f"image:{name}" or not runtime.digest.startswith(digest):
        return (f"the task declares environment {declared} but the sandbox runs "
                f"{runtime.id}; start the pool with PoolConfig(image=<that image's "
                "directory>) (`trialbox image list`), or rebuild the image and update the "
                "task's hash")
    return ""
