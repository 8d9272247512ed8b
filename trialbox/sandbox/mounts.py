"""Host-side mount and file primitives for the namespace tier (Linux syscalls via ctypes).

The supervisor (root, host namespaces) mounts one size-limited tmpfs per session, clones
its `work`, `tmp` and `shm` directories as detached mount trees (`open_tree`) for each run,
and reads and writes workspace files without ever following a link the candidate made.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading

from trialbox.errors import UsageError


class PathObstructed(UsageError):
    """A workspace path cannot be used as asked because of what is in the workspace (a
    directory where a file should be, a file or link where a directory should be): in
    a session, usually the candidate's doing."""


class WorkspaceFull(UsageError):
    """A write does not fit in the session's workspace (Limits.disk_mb)."""


LIST_MAX = 100_000
"""Entries `list_files` reports at most (a workspace's inodes are bounded anyway)."""
LIST_DEPTH = 256
"""Directory levels `list_files` descends."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MS_REC, MS_PRIVATE = 16384, 1 << 18
CLONE_NEWNS = 0x00020000
MNT_DETACH = 2
SYS_OPEN_TREE = 428
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_FDCWD = -100


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def mount_tmpfs(path: str, size_bytes: int, uid: int = 0, mode: int = 0o755,
                inodes: int = 0) -> None:
    """A tmpfs of `size_bytes` (and at most `inodes` files, directories and links, when
    given: each costs kernel memory that the size does not count)."""
    opts = f"size={size_bytes},mode={mode:o},uid={uid},gid={uid}"
    if inodes:
        opts += f",nr_inodes={inodes}"
    if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                   opts.encode()) != 0:
        raise _err(f"mount tmpfs on {path}")


def private_usr_overlay(empty: str) -> None:
    """In a new mount namespace of this process: an overlay of /usr over /usr (read-only,
    `empty` as its second layer). For a zygote's preexec: exec'd from it, the zygote's
    executable is the overlay's file while its pages are mapped through the real one,
    which lets each cell make its own copy its /proc/self/exe (zygote.set_exe)."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise _err("unshare(CLONE_NEWNS)")
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise _err("make / private")
    overlay_ro("/usr", "/usr", empty)


def overlay_ro(lower: str, target: str, empty: str) -> None:
    """A read-only overlay of `lower` at `target` (overlayfs wants two layers without an
    upper one: `empty`, an empty directory, is the second)."""
    for p in (lower, empty):
        if any(c in p for c in ":,\\"):
            raise ValueError(f"overlay layer path with ':', ',' or '\\': {p!r}")
    data = f"lowerdir={lower}:{empty}".encode()
    if _libc.mount(b"overlay", target.encode(), b"overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                   data) != 0:
        raise _err(f"mount an overlay of {lower} on {target}")


def overlay_view(lower: str, target: str, empty: str,
                 flags: int = MS_RDONLY | MS_NOSUID | MS_NODEV) -> None:
    """A read-only overlay of `lower` at `target` (`empty`, an empty directory, its
    second layer) whose layers are named by /proc/self/fd paths, so a mount table that
    shows it names no host path. Its inodes are its own (overlay inodes are per mount):
    inotify watches, flock and OFD locks on them reach neither `lower`'s files nor
    another overlay's (docs/adversary.md, K; zygote.overlay does the same in a cell)."""
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in (lower, empty)]
    try:
        data = "lowerdir=/proc/self/fd/%d:/proc/self/fd/%d" % tuple(fds)
        if _libc.mount(b"overlay", target.encode(), b"overlay", flags, data.encode()) != 0:
            raise _err(f"mount an overlay of {lower} on {target}")
    finally:
        for fd in fds:
            os.close(fd)


def umount(path: str) -> None:
    if _libc.umount2(path.encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            raise _err(f"umount {path}")


def open_tree_clone(path: str) -> int:
    """A detached copy of the mount at `path`, as an fd another mount namespace can attach."""
    fd = int(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(),
                           OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC))
    if fd < 0:
        raise _err(f"open_tree {path}")
    return fd


def mounts_under(prefix: str) -> list[str]:
    """Mount points at or below `prefix`, deepest first (the order to unmount them)."""
    prefix = prefix.rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                found.append(mp)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


# ------------------------------------------------------------ workspace file access

def _parts(path: str) -> list[str]:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise UsageError(f"workspace path must be a non-empty string without NUL, got "
                         f"{path!r}")
    rel = path[len("/workspace/"):] if path.startswith("/workspace/") else path
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or ".." in parts or not parts:
        raise UsageError(f"workspace path {path!r} must be relative to the workspace "
                         "(or under /workspace/) and must not contain '..'")
    return parts


def _open_dir_chain(root: str | int, parts: list[str], create: bool, uid: int) -> int:
    """Walk `parts` under `root` (a path, or a directory fd of ours) with O_NOFOLLOW at
    every step; return a dir fd."""
    fd = os.dup(root) if isinstance(root, int) else os.open(
        root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                              os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                              os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PathObstructed(f"{part!r} in the workspace is not a directory "
                                         "(links are never followed)") from e
                if e.errno == errno.ENAMETOOLONG:
                    raise UsageError(f"workspace path too long at {part!r}") from e
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file(root: str, path: str, data: bytes, uid: int, mode: int = 0o644) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"file data must be bytes, got {type(data).__name__}; encode text "
                         "first (e.g. text.encode())")
    parts = _parts(path)
    dfd = _open_dir_chain(root, parts[:-1], True, uid)
    try:
        try:
            os.unlink(parts[-1], dir_fd=dfd)
        except FileNotFoundError:
            pass
        except IsADirectoryError as e:
            raise PathObstructed(f"{path!r} is a directory in the workspace") from e
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                     os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fchown(fd, uid, uid)
        except BaseException:
            os.close(fd)
            os.unlink(parts[-1], dir_fd=dfd)  # no partial file left behind
            raise
        else:
            os.close(fd)
    finally:
        os.close(dfd)


def read_file(root: str, path: str, max_bytes: int) -> bytes:
    parts = _parts(path)
    dfd = _open_dir_chain(root, parts[:-1], False, 0)
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                         os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UsageError(f"{path!r} in the workspace is a symbolic link; links are "
                                 "never followed") from e
            if e.errno == errno.ENOENT:
                raise
            # a socket (ENXIO), or anything else that is not a file one can read
            raise UsageError(f"{path!r} in the workspace cannot be read: "
                             f"{os.strerror(e.errno or errno.EIO)}") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"{path!r} in the workspace is not a regular file")
            if st.st_size > max_bytes:
                raise UsageError(f"{path!r} is {st.st_size} bytes, above max_bytes="
                                 f"{max_bytes}; raise max_bytes to read it")
            chunks = []
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def list_files(root: str, max_entries: int = LIST_MAX,
               max_depth: int = LIST_DEPTH) -> list[str]:
    """Every entry under `root` that is not a directory (files, links — listed, never
    followed — and the odd socket), relative, sorted. Iterative (a chain of thousands
    of directories is no recursion), bounded: a UsageError past `max_entries` entries
    or `max_depth` levels. Names are the kernel's bytes decoded as os does
    (surrogateescape for bytes that are not UTF-8)."""
    out: list[str] = []
    seen = 0
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        stack = [("", 0)]
        while stack:
            rel, depth = stack.pop()
            try:
                fd = os.open(rel or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                             os.O_CLOEXEC, dir_fd=top)
            except OSError as e:
                if e.errno == errno.ENAMETOOLONG:
                    raise UsageError(f"the workspace's directories nest too deep to list "
                                     f"(a path passed {len(rel)} characters)") from e
                continue  # gone, or no longer a directory
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > max_entries:
                            raise UsageError(f"the workspace holds more than "
                                             f"{max_entries:,} entries; too many to list")
                        path = f"{rel}/{entry.name}" if rel else entry.name
                        if entry.is_dir(follow_symlinks=False):
                            if depth + 1 >= max_depth:
                                raise UsageError(f"the workspace's directories nest more "
                                                 f"than {max_depth} levels; too deep to list")
                            stack.append((path, depth + 1))
                        else:
                            out.append(path)
            finally:
                os.close(fd)
    finally:
        os.close(top)
    return sorted(out)


# ------------------------------------------------ the new mount API (snapshots, forks)
# Detached mounts held as fds: a frozen layer lives exactly as long as its fd (and the
# overlays that use it) and is never reachable by a host path (snapshot.py).

SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT, SYS_FSPICK = 429, 430, 431, 432, 433
SYS_MOUNT_SETATTR = 442
FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSCONFIG_SET_FD = 0, 1, 5
FSCONFIG_CMD_CREATE, FSCONFIG_CMD_RECONFIGURE = 6, 7
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
MOUNT_ATTR_IDMAP = 0x100000
MOVE_MOUNT_F_EMPTY_PATH = 4
AT_EMPTY_PATH = 0x1000
CLONE_NEWUSER, CLONE_VM, SIGCHLD = 0x10000000, 0x100, 17


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _sys(what: str, *args: object) -> int:
    r = int(_libc.syscall(*args))
    if r < 0:
        raise _err(what)
    return r


def new_mount(fstype: str, options: list[tuple[str, str | int | None]],
              attrs: int = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) -> int:
    """A new filesystem as a detached mount (fd): `options` are fsconfig keys, a str
    value set as a string, an int as an fd (overlay's layers), None as a flag."""
    fs = _sys(f"fsopen {fstype}", SYS_FSOPEN, fstype.encode(), 1)  # FSOPEN_CLOEXEC
    try:
        for key, value in options:
            if value is None:
                _sys(f"{fstype} {key}", SYS_FSCONFIG, fs, FSCONFIG_SET_FLAG, key.encode(),
                     None, 0)
            elif isinstance(value, int):
                _sys(f"{fstype} {key}", SYS_FSCONFIG, fs, FSCONFIG_SET_FD, key.encode(),
                     None, ctypes.c_int(value))
            else:
                _sys(f"{fstype} {key}={value}", SYS_FSCONFIG, fs, FSCONFIG_SET_STRING,
                     key.encode(), value.encode(), 0)
        _sys(f"create {fstype}", SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0)
        return _sys(f"fsmount {fstype}", SYS_FSMOUNT, fs, 1, attrs)  # FSMOUNT_CLOEXEC
    finally:
        os.close(fs)


def clone_mount(fd: int, sub: str = "") -> int:
    """A detached copy of the mount `fd` refers to (rooted at `sub` below it, if given)."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (0 if sub else AT_EMPTY_PATH)
    return _sys(f"open_tree {sub or '.'}", SYS_OPEN_TREE, fd, sub.encode(), flags)


def set_mount_attrs(fd: int, attrs: int, userns_fd: int = -1) -> None:
    """mount_setattr on the detached mount `fd` (MOUNT_ATTR_IDMAP needs `userns_fd`)."""
    a = _MountAttr(attr_set=attrs, userns_fd=max(userns_fd, 0))
    _sys("mount_setattr", SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(a),
         ctypes.sizeof(a))


def freeze_superblock(fd: int = AT_FDCWD, path: str = "") -> None:
    """Make the filesystem of the mount at `fd`/`path` read-only for every mount of it
    (a superblock flag: clones attached elsewhere cannot write either). OSError EBUSY
    while any file of it is open for writing."""
    flags = 1 | (8 if not path else 0)  # FSPICK_CLOEXEC | FSPICK_EMPTY_PATH
    pick = _sys(f"fspick {path}", SYS_FSPICK, fd, path.encode(), flags)
    try:
        _sys("fsconfig ro", SYS_FSCONFIG, pick, FSCONFIG_SET_FLAG, b"ro", None, 0)
        _sys("reconfigure ro", SYS_FSCONFIG, pick, FSCONFIG_CMD_RECONFIGURE, None, None, 0)
    finally:
        os.close(pick)


def attach_mount(fd: int, path: str) -> None:
    """Attach the detached mount `fd` at host `path`."""
    _sys(f"move_mount {path}", SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, path.encode(),
         MOVE_MOUNT_F_EMPTY_PATH)


_libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_PAUSE = ctypes.cast(_libc.pause, ctypes.c_void_p).value
_STACK = ctypes.create_string_buffer(1 << 14)
_STACK_LOCK = threading.Lock()


def idmap_userns(outside_from: int, inside_to: int) -> int:
    """An fd of a new user namespace whose maps say: on-disk uid/gid `outside_from`
    reads as `inside_to` (for MOUNT_ATTR_IDMAP). Made by a child that only ever runs
    pause() on a small stack of ours (CLONE_VM: nothing of this process is copied;
    ~0.1 ms) and is killed as soon as its namespace is open."""
    with _STACK_LOCK:  # one child on the stack at a time
        return _idmap_userns(outside_from, inside_to)


def _idmap_userns(outside_from: int, inside_to: int) -> int:
    top = ctypes.addressof(_STACK) + len(_STACK) - 64
    pid = int(_libc.clone(_PAUSE, top, CLONE_NEWUSER | CLONE_VM | SIGCHLD, None))
    if pid < 0:
        raise _err("clone(CLONE_NEWUSER)")
    try:
        for name in ("uid_map", "gid_map"):
            fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, f"{outside_from} {inside_to} 1\n".encode())
            finally:
                os.close(fd)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
