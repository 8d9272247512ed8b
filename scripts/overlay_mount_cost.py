"""CPU per mount of a cell's runtime view: a read-only overlay of /usr (issue 28) against
the bind and read-only remount it replaced. Run as root: `python3 scripts/overlay_mount_cost.py`.

Each variant is mounted and unmounted 300 times in a private mount namespace (nothing
reaches the host's mount table); CPU by `time.thread_time`, median; two rounds each,
alternating.
"""

import ctypes
import os
import statistics
import tempfile
import time

libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 32, 4096, 16384, 1 << 18)


def _enc(s):
    return s.encode() if s else None


def mount(src, target, fstype, flags, data=None):
    if libc.mount(_enc(src), _enc(target), _enc(fstype), flags, _enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {src} on {target}: {os.strerror(e)}")


def main() -> None:
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise OSError(ctypes.get_errno(), "unshare (run as root)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    base = tempfile.mkdtemp()
    mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV)
    target, empty = os.path.join(base, "t"), os.path.join(base, "e")
    os.mkdir(target)
    os.mkdir(empty)
    ro = MS_RDONLY | MS_NOSUID | MS_NODEV

    def overlay() -> None:  # as zygote.overlay does it
        fds = [os.open(p, os.O_PATH) for p in ("/usr", empty)]
        mount("overlay", target, "overlay", ro,
              "lowerdir=/proc/self/fd/%d:/proc/self/fd/%d" % tuple(fds))
        for fd in fds:
            os.close(fd)

    def bind() -> None:  # as the cells' root was built before
        mount("/usr", target, None, MS_BIND | MS_REC)
        mount(None, target, None, MS_REMOUNT | MS_BIND | ro)

    for name, make in (("overlay", overlay), ("bind+remount", bind)) * 2:
        cpu = []
        for _ in range(300):
            t = time.thread_time()
            make()
            cpu.append(time.thread_time() - t)
            libc.umount2(target.encode(), 2)
        print(f"{name:13s} CPU per mount, median {statistics.median(cpu) * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
