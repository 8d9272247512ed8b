"""The archive format of saved snapshots (snapshot.py's `Snapshot.save`/`load`).

    <name>.tar.zst   the layers flattened into one tree (a read-only overlay of them),
                     as a PAX tar under `root/`: sorted, modes and mtimes kept, hard
                     links as links, symbolic links verbatim, sockets left out; zstd
    <name>.json      format, sha256 and size of the archive, files, entries, bytes,
                     the tmpfs it needs; written after the archive

Loading checks the sha256 before anything is extracted, then extracts into a fresh tmpfs
without ever following a link, and makes it read-only: a frozen layer (a detached mount
fd) for `Snapshot.load` to stand forks on.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

from trialbox.errors import SandboxStartError, UsageError
from trialbox.sandbox import mounts

if TYPE_CHECKING:
    from trialbox.store.artifacts import ArtifactStore

FORMAT = "trialbox-snapshot/1"
ARCHIVE_ROOT = "root"


def _flat_view(layer_fds: list[int]) -> tuple[int, bool]:
    """A read-only mount showing the layers merged (an overlay without an upper), or
    the one layer itself; and whether the fd is ours to close."""
    if len(layer_fds) == 1:
        return layer_fds[0], False
    opts: list[tuple[str, str | int | None]] = [("lowerdir+", fd) for fd in layer_fds]
    return mounts.new_mount("overlay", opts + [("redirect_dir", "follow")],
                            mounts.MOUNT_ATTR_RDONLY | mounts.MOUNT_ATTR_NOSUID |
                            mounts.MOUNT_ATTR_NODEV), True


def _walk(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of everything under `root`, each directory before what
    it holds, names sorted (the same tree gives the same archive)."""
    stack = [""]
    while stack:
        rel = stack.pop()
        subdirs = []
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            yield path, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(path)
        stack.extend(reversed(subdirs))


def _tar_tree(root: str, out: IO[bytes]) -> dict[str, int]:
    """Write the tree under `root` as a tar stream (members under ARCHIVE_ROOT/)."""
    files = entries = size = pages = 0
    links: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel, st in _walk(root):
            info = tarfile.TarInfo(f"{ARCHIVE_ROOT}/{rel}")
            info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
            entries += 1
            pages += 4096
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(os.path.join(root, rel))
                tar.addfile(info)
            elif stat.S_ISFIFO(st.st_mode):
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in links:
                    info.type, info.linkname = tarfile.LNKTYPE, links[key]
                    tar.addfile(info)
                    continue
                links[key] = info.name
                fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NOFOLLOW |
                             os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    extents = _data_extents(fd, st)
                    if extents is not None:  # holes: only the data travels
                        info.pax_headers = {SPARSE_KEY: f"{st.st_size};" + ",".join(
                            f"{off}:{n}" for off, n in extents)}
                    info.size = sum(n for _o, n in extents) if extents is not None \
                        else st.st_size
                    files += 1
                    size += info.size
                    pages += sum(-(-n // 4096) * 4096 for _o, n in extents) \
                        if extents is not None else -(-st.st_size // 4096) * 4096
                    tar.addfile(info, _ExtentReader(fd, extents) if extents is not None
                                else f)
            # sockets (and nothing else can be there) are not state: left out
    return {"files": files, "entries": entries, "bytes": size, "tmpfs_bytes": pages}


SPARSE_KEY = "TRIALBOX.sparse"
"""A PAX record on a file with holes: "<size>;<offset>:<length>,..." — the member's data
is those extents only, in order. A session's files are bounded by disk_mb in pages, not
in apparent size: 400 files of 31 MiB of holes (0 bytes used) archived as 13 GB of zeros
(48 s) and would unpack to 13 GB of memory."""


def _data_extents(fd: int, st: os.stat_result) -> list[tuple[int, int]] | None:
    """The (offset, length) runs of data of a file with holes; None for a dense file."""
    if st.st_blocks * 512 >= st.st_size:
        return None
    extents, off = [], 0
    while off < st.st_size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only holes from here on
                break
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), st.st_size)
        extents.append((start, end - start))
        off = end
    return extents


class _ExtentReader:
    """A file's data extents read one after the other (what tarfile copies)."""

    def __init__(self, fd: int, extents: list[tuple[int, int]]) -> None:
        self._fd, self._todo = fd, list(reversed(extents))

    def read(self, n: int = -1) -> bytes:
        while self._todo:
            off, left = self._todo[-1]
            if left == 0:
                self._todo.pop()
                continue
            chunk = os.pread(self._fd, left if n < 0 else min(n, left), off)
            if not chunk:
                raise OSError(errno.EIO, "a frozen snapshot file got shorter")
            self._todo[-1] = (off + len(chunk), left - len(chunk))
            return chunk
        return b""


def _sparse_map(m: tarfile.TarInfo, name: str) -> tuple[int, list[tuple[int, int]]] | None:
    """A member's SPARSE_KEY record, checked: extents in order, inside the size, adding
    up to the member's data."""
    rec = m.pax_headers.get(SPARSE_KEY)
    if rec is None:
        return None
    try:
        head, _, body = rec.partition(";")
        total = int(head)
        extents = [(int(o), int(n)) for o, n in (e.split(":") for e in body.split(",") if e)]
    except ValueError:
        extents, total = [(-1, 0)], -1
    end = 0
    for off, n in extents:
        if off < end or n < 0:
            break
        end = off + n
    else:
        if end <= total and sum(n for _o, n in extents) == m.size:
            return total, extents
    raise UsageError(f"snapshot archive {name}: member {m.name!r} has a malformed "
                     f"{SPARSE_KEY} record; it was not written by Snapshot.save")


def save_layers(store: ArtifactStore, name: str, layer_fds: list[int]) -> dict[str, Any]:
    view, own = _flat_view(layer_fds)
    try:
        zstd = subprocess.Popen(["zstd", "-q", "-3", "-T0", "-c"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        assert zstd.stdin is not None and zstd.stdout is not None
        counts: dict[str, int] = {}
        failure: list[BaseException] = []

        def feed() -> None:
            assert zstd.stdin is not None
            try:
                counts.update(_tar_tree(f"/proc/self/fd/{view}", zstd.stdin))
            except BaseException as e:  # reported below, on the caller's thread
                failure.append(e)
            finally:
                zstd.stdin.close()

        feeder = threading.Thread(target=feed, name="trialbox-snapshot-tar")
        feeder.start()
        digest, compressed = hashlib.sha256(), 0
        with store.open(f"{name}.tar.zst", "wb") as f:
            while chunk := zstd.stdout.read(1 << 20):
                digest.update(chunk)
                compressed += len(chunk)
                f.write(chunk)
        feeder.join()
        if zstd.wait() != 0 or failure:
            raise SandboxStartError(f"could not archive snapshot {name}: "
                                    f"{failure[0] if failure else 'zstd failed'}")
    finally:
        if own:
            os.close(view)
    return dict(counts, archive=f"{name}.tar.zst", sha256=digest.hexdigest(),
                compressed_bytes=compressed, saved_at=time.time())


def load_tree(store: ArtifactStore, name: str, meta: Mapping[str, Any], owner: int) -> int:
    # An archive Snapshot.save wrote is never larger than the tmpfs it unpacks to (a
    # 4 KiB page per entry covers its headers): more is refused before it fills the
    # host's temporary disk.
    size = int(meta["tmpfs_bytes"]) + (1 << 20)
    with tempfile.TemporaryFile() as tmp:
        digest, read = hashlib.sha256(), 0
        with store.open(str(meta.get("archive") or f"{name}.tar.zst"), "rb") as f:
            while chunk := f.read(1 << 20):
                read += len(chunk)
                if read > size:
                    raise UsageError(f"snapshot archive {name}.tar.zst is larger than the "
                                     f"{size} bytes its metadata unpacks to; save it again")
                digest.update(chunk)
                tmp.write(chunk)
        if digest.hexdigest() != meta.get("sha256"):
            raise UsageError(f"snapshot archive {name}.tar.zst does not match its metadata "
                             f"(sha256 {digest.hexdigest()}, expected {meta.get('sha256')}): "
                             "it was changed or cut short; save the snapshot again")
        tmp.seek(0)
        # inodes cost kernel memory outside the tmpfs's size: no more than save counted
        # (a page each)
        inodes = min(int(meta["entries"]), int(meta["tmpfs_bytes"]) // 4096) + 64
        fs = mounts.new_mount("tmpfs", [("size", str(size)),
                                        ("nr_inodes", str(inodes)),
                                        ("mode", "755")])
        try:
            zstd = subprocess.Popen(["zstd", "-q", "-d", "-c"], stdin=tmp,
                                    stdout=subprocess.PIPE)
            assert zstd.stdout is not None
            try:
                _untar(zstd.stdout, fs, owner, name)
                # tarfile stops at the end-of-archive blocks; the record padding after
                # them is still coming: read it, or zstd meets a closed pipe and fails
                # (under load it was still writing: "not valid zstd" for a good archive)
                trailing = 0
                while chunk := zstd.stdout.read(1 << 16):
                    trailing += len(chunk)
                    if trailing > 1 << 20:  # a record's padding is 10 KiB at most
                        zstd.kill()
                        raise UsageError(f"snapshot archive {name}.tar.zst has data after "
                                         "its end; save the snapshot again")
            finally:
                zstd.stdout.close()
                if zstd.wait() != 0:
                    raise UsageError(f"snapshot archive {name}.tar.zst is not valid zstd")
            mounts.freeze_superblock(fs)
            mounts.set_mount_attrs(fs, mounts.MOUNT_ATTR_RDONLY | mounts.MOUNT_ATTR_NOSUID |
                                   mounts.MOUNT_ATTR_NODEV)
            return fs
        except BaseException:
            os.close(fs)
            raise


def _untar(stream: IO[bytes], root: int, owner: int, name: str) -> None:
    """Extract a snapshot archive under `root` without ever following a link: every
    parent is walked with O_NOFOLLOW (mounts._open_dir_chain), members outside
    ARCHIVE_ROOT/, with '..' or of other types are refused."""
    dirs: list[tuple[list[str], int, int]] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|", tarinfo=_BoundedInfo) as tar:
            for m in tar:
                parts = _member_parts(m.name, name)
                if not parts:
                    continue
                mode = m.mode & 0o1777  # never setuid/setgid (and the mount is nosuid)
                if m.isdir():
                    dfd = mounts._open_dir_chain(root, parts, True, owner)
                    os.close(dfd)
                    dirs.append((parts, mode, int(m.mtime)))
                    continue
                dfd = mounts._open_dir_chain(root, parts[:-1], True, owner)
                try:
                    leaf = parts[-1]
                    if m.isreg():
                        src = tar.extractfile(m)
                        assert src is not None
                        fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                                     os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
                        with os.fdopen(fd, "wb") as out:
                            sparse = _sparse_map(m, name)
                            if sparse is None:
                                while chunk := src.read(1 << 20):
                                    out.write(chunk)
                                out.flush()  # before the mtime is set
                            else:  # the data where it was, holes left holes
                                for off, left in sparse[1]:
                                    while left:
                                        chunk = src.read(min(left, 1 << 20))
                                        if not chunk:
                                            raise tarfile.ReadError("cut short")
                                        os.pwrite(fd, chunk, off)
                                        off, left = off + len(chunk), left - len(chunk)
                                os.ftruncate(fd, sparse[0])
                            os.fchmod(fd, mode)
                            os.fchown(fd, owner, owner)
                            os.utime(fd, (m.mtime, m.mtime))
                    elif m.issym():
                        os.symlink(m.linkname, leaf, dir_fd=dfd)
                        os.chown(leaf, owner, owner, dir_fd=dfd, follow_symlinks=False)
                    elif m.islnk():
                        target = _member_parts(m.linkname, name)
                        sfd = mounts._open_dir_chain(root, target[:-1], False, owner)
                        try:
                            os.link(target[-1], leaf, src_dir_fd=sfd, dst_dir_fd=dfd,
                                    follow_symlinks=False)
                        finally:
                            os.close(sfd)
                    elif m.isfifo():
                        os.mkfifo(leaf, mode, dir_fd=dfd)
                        os.chown(leaf, owner, owner, dir_fd=dfd, follow_symlinks=False)
                    else:
                        raise UsageError(f"snapshot archive {name}: member {m.name!r} is "
                                         "of a type a workspace never holds")
                finally:
                    os.close(dfd)
    except tarfile.TarError as e:
        raise UsageError(f"snapshot archive {name}.tar.zst is not a valid archive: "
                         f"{e}") from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise UsageError(f"snapshot archive {name} holds more than its metadata "
                             "says; save it again") from e
        # a member Snapshot.save never writes: a name twice, a hard link to a directory
        raise UsageError(f"snapshot archive {name}.tar.zst could not be extracted ({e}); "
                         "it was not written by Snapshot.save") from e
    for parts, mode, mtime in reversed(dirs):  # deepest last-made first: modes after
        dfd = mounts._open_dir_chain(root, parts, False, owner)
        try:
            os.fchmod(dfd, mode)
            os.fchown(dfd, owner, owner)
            os.utime(dfd, (mtime, mtime))
        finally:
            os.close(dfd)


class _BoundedInfo(tarfile.TarInfo):
    """A member whose own header records (PAX, GNU long names) are read into memory
    whole by tarfile: more than 1 MiB of them (a few bytes of zstd) is refused first."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                         tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) \
                and self.size > 1 << 20:
            raise tarfile.HeaderError(f"a {self.size}-byte header record")
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]


def _member_parts(member: str, name: str) -> list[str]:
    parts = [p for p in member.split("/") if p not in ("", ".")]
    if not parts or parts[0] != ARCHIVE_ROOT or ".." in parts or member.startswith("/") \
            or any("\x00" in p for p in parts):
        raise UsageError(f"snapshot archive {name}: member {member!r} is outside "
                         f"{ARCHIVE_ROOT}/; it was not written by Snapshot.save")
    return parts[1:]
