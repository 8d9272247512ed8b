"""CPU a container start spends on its own views (issue 28): the runtime's private mount
namespace with overlays of the root skeleton, /usr, /etc/alternatives, /.tb and /dev
(oci.private_views) against the namespace and /dev bind it replaced; and what a
sandbox's /proc view files cost (procview.ProcView: made once per cell or session,
`show` per run). Run as root from the repository: `python3 scripts/container_views_cost.py`.

Each private-namespace variant runs in a freshly forked child (as in a runtime's
preexec; the namespace dies with it, nothing reaches the host's mount table), 300 times,
alternating; CPU by `time.thread_time_ns`, median. Prints the load beside the figures.
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trialbox.sandbox import mounts
from trialbox.sandbox.oci import (CLONE_NEWNS, MS_PRIVATE, MS_REC,
                                  make_dev_dir, private_views)
from trialbox.sandbox.procview import ProcView
from trialbox.types import Limits

N = 300


def in_child(fn):
    """CPU (µs) `fn` took in a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        t = time.thread_time_ns()
        fn()
        os.write(w, str(time.thread_time_ns() - t).encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return int(out) / 1000


def main() -> None:
    base = tempfile.mkdtemp(dir="/run")
    dev, empty, root, tb = (os.path.join(base, n) for n in ("dev", "empty", "root", "tb"))
    make_dev_dir(dev)
    for d in (empty, root, tb):
        os.mkdir(d)
    trees = [root, "/usr", "/etc/alternatives", tb]

    def old() -> None:  # before: a private namespace whose /dev is a bind of the nodes
        libc = mounts._libc
        assert libc.unshare(CLONE_NEWNS) == 0
        assert libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
        assert libc.mount(dev.encode(), b"/dev", None, 0x1000, None) == 0  # MS_BIND

    def new() -> None:
        private_views(dev, trees, empty)

    try:
        load = os.getloadavg()[0]
        before, after = [], []
        for _ in range(N):
            before.append(in_child(old))
            after.append(in_child(new))
        views = os.path.join(base, "views")  # a tmpfs, as a pool's or provider's
        os.mkdir(views)
        mounts.mount_tmpfs(views, 16 << 20)
        ProcView(os.path.join(views, "warm"), Limits())  # the host's figures, read once
        made, same, other = [], [], []
        limits, changed = Limits(wall_s=3), Limits(memory_mb=64)
        for i in range(N):
            t = time.thread_time_ns()
            view = ProcView(os.path.join(views, str(i)), Limits())
            made.append(time.thread_time_ns() - t)
            t = time.thread_time_ns()
            view.show(limits)
            same.append(time.thread_time_ns() - t)
            t = time.thread_time_ns()
            view.show(changed)
            other.append(time.thread_time_ns() - t)
    finally:
        for mp in mounts.mounts_under(base):
            mounts.umount(mp)
        shutil.rmtree(base, ignore_errors=True)
    med = statistics.median
    print(f"load {load:.1f} -> {os.getloadavg()[0]:.1f}, CPU medians of {N}:")
    rows = [("runtime namespace + /dev bind (before)", f"{med(before):.0f} µs"),
            (f"runtime namespace + {len(trees)} overlays + /dev overlay",
             f"{med(after):.0f} µs"),
            ("ProcView made (4 files)", f"{med(made) / 1000:.0f} µs"),
            ("ProcView.show, same limits / other limits",
             f"{med(same) / 1000:.1f} / {med(other) / 1000:.0f} µs")]
    for label, value in rows:
        print(f"  {label:<48} {value}")

if __name__ == "__main__":
    main()
