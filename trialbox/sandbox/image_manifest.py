"""What an image holds, and proof that it still holds it: manifests, content hashes, seals.

A *manifest* lists every entry of an image's root filesystem — path, type, mode, size,
and the sha256 of a file's bytes (a link's target) — sorted by path; the image's
*content hash* is the sha256 of that list written canonically, so two roots with the same
manifest have the same hash and any changed byte, mode, file or link changes it.
Ownership is not in it: the image is root's, and a candidate runs as another user.

A *seal* is what the filesystem says about each entry right after a full hash: inode,
size, mtime and ctime (ns). The cheap check before each task compares the seal with a
fresh `lstat` of every entry — no file is read. Writing a file, renaming one over it,
`chmod` or `utime` all move its ctime, which no one can set back (only the clock), so an
unchanged seal means an unchanged file; the periodic and on-demand full re-hash read
every byte again and need no such argument.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass

_BLOCK = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One manifest line."""

    path: str
    """Relative to the root, '/'-separated, e.g. `usr/bin/python3.11`."""
    kind: str
    """`f` file, `d` directory, `l` symbolic link, `c`/`b` device, `p` fifo, `s` socket."""
    mode: int
    """Permission bits (with setuid/setgid/sticky)."""
    size: int
    """Bytes of a file, length of a link's target, 0 otherwise."""
    digest: str
    """sha256 of a file's bytes or a link's target; "" for the rest."""

    def to_json(self) -> list[object]:
        return [self.path, self.kind, f"{self.mode:o}", self.size, self.digest]

    @staticmethod
    def from_json(row: list[object]) -> Entry:
        return Entry(str(row[0]), str(row[1]), int(str(row[2]), 8), int(str(row[3])),
                     str(row[4]))


_KINDS = ((stat.S_ISREG, "f"), (stat.S_ISDIR, "d"), (stat.S_ISLNK, "l"), (stat.S_ISCHR, "c"),
          (stat.S_ISBLK, "b"), (stat.S_ISFIFO, "p"), (stat.S_ISSOCK, "s"))


def _kind(mode: int) -> str:
    for test, k in _KINDS:
        if test(mode):
            return k
    return "?"


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while True:
            b = os.read(fd, _BLOCK)
            if not b:
                break
            h.update(b)
    finally:
        os.close(fd)
    return h.hexdigest()


Seal = dict[str, tuple[int, int, int, int]]
"""path -> (inode, size, mtime_ns, ctime_ns), for the cheap check."""


def walk(root: str) -> list[tuple[str, os.stat_result]]:
    """Every entry under `root` (not `root` itself), sorted by path; links not followed.
    Stays on `root`'s filesystem: nothing mounted inside a root belongs to the image."""
    out: list[tuple[str, os.stat_result]] = []
    dev = os.lstat(root).st_dev
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            for e in it:
                p = f"{rel}/{e.name}" if rel else e.name
                st = e.stat(follow_symlinks=False)
                out.append((p, st))
                if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                    stack.append(p)
    out.sort(key=lambda x: x[0])
    return out


def build_manifest(root: str) -> tuple[list[Entry], Seal]:
    """The manifest of `root` (every byte read) and the seal taken as it was read."""
    entries: list[Entry] = []
    seal: Seal = {}
    for rel, st in walk(root):
        k = _kind(st.st_mode)
        full = os.path.join(root, rel)
        if k == "f":
            digest, size = file_sha256(full), st.st_size
        elif k == "l":
            target = os.readlink(full).encode("utf-8", "surrogateescape")
            digest, size = hashlib.sha256(target).hexdigest(), len(target)
        else:
            digest, size = "", 0
        entries.append(Entry(rel, k, stat.S_IMODE(st.st_mode), size, digest))
        seal[rel] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return entries, seal


def content_hash(entries: list[Entry]) -> str:
    """sha256 over the manifest's canonical text (one JSON row per line)."""
    h = hashlib.sha256()
    for e in entries:
        h.update(json.dumps(e.to_json(), separators=(",", ":")).encode("utf-8",
                                                                       "surrogateescape"))
        h.update(b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class Difference:
    """One path whose entry differs between two manifests, and how."""

    path: str
    why: str
    """`added`, `removed`, `content` (same size, other bytes), `size a -> b`,
    `mode 644 -> 755`, `kind f -> l`."""

    def __str__(self) -> str:
        return f"{self.path} ({self.why})"


def diff(old: list[Entry], new: list[Entry]) -> list[Difference]:
    """What changed from `old` to `new`, sorted by path."""
    a = {e.path: e for e in old}
    b = {e.path: e for e in new}
    out: list[Difference] = []
    for p in sorted(a.keys() | b.keys()):
        x, y = a.get(p), b.get(p)
        if x is None:
            out.append(Difference(p, "added"))
        elif y is None:
            out.append(Difference(p, "removed"))
        elif x.kind != y.kind:
            out.append(Difference(p, f"kind {x.kind} -> {y.kind}"))
        elif x.size != y.size:
            out.append(Difference(p, f"size {x.size} -> {y.size}"))
        elif x.digest != y.digest:
            out.append(Difference(p, "content" if x.kind == "f" else "link target"))
        elif x.mode != y.mode:
            out.append(Difference(p, f"mode {x.mode:o} -> {y.mode:o}"))
    return out


def check_seal(root: str, seal: Seal) -> list[Difference]:
    """The cheap check: `lstat` every sealed entry and look for new ones in every
    directory whose own seal moved (adding or removing a name moves the directory's
    ctime). No file is read."""
    out: list[Difference] = []
    moved_dirs: list[str] = []
    for rel, (ino, size, mtime, ctime) in seal.items():
        try:
            st = os.lstat(os.path.join(root, rel))
        except FileNotFoundError:
            out.append(Difference(rel, "removed"))
            continue
        if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (ino, size, mtime,
                                                                       ctime):
            out.append(Difference(rel, "changed since sealed (inode/size/mtime/ctime)"))
            if stat.S_ISDIR(st.st_mode):
                moved_dirs.append(rel)
    for rel, _st in _top(root, seal):
        out.append(Difference(rel, "added"))
    for d in moved_dirs:
        for name in os.listdir(os.path.join(root, d)):
            p = f"{d}/{name}"
            if p not in seal:
                out.append(Difference(p, "added"))
    return sorted(out, key=lambda d: d.path)


def _top(root: str, seal: Seal) -> list[tuple[str, os.stat_result]]:
    """Names added directly under the root (its own ctime is not sealed: its mount
    point's may be anyone's)."""
    return [(n, os.lstat(os.path.join(root, n))) for n in os.listdir(root)
            if n not in seal]


def save(path: str, obj: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=None, separators=(",", ":"), sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def load(path: str) -> object:
    with open(path) as f:
        return json.load(f)
