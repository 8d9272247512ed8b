"""The user namespace a container session joins, owned by its own unprivileged host uid
(the `container` tier: oci.py).

Per-user kernel budgets are charged by host uid: pipe-buffer pages to a process's uid,
and inotify instances, POSIX message queue bytes and the like to its uid in its user
namespace *and to the owner of every user namespace above it*. runc and crun create the
container's user namespace as host root, so before this every container session charged
host root and shared one uid range with every other session: 128 inotify instances in
one sandbox made host root's `inotify_init1` fail (EMFILE), and one session's pipes
shrank everyone's. Now each session

* leases a block of 65,536 host uids of its own from the node's grid (uids.py: unique on
  the node across processes, crash-safe), for its container's uids 0..65535;
* has its container join a user namespace made here (`make_userns`) by a helper running
  as the block's first uid (the container's root), so that uid, not host root, is the
  namespace's owner and pays for what the sandbox holds.
"""

from __future__ import annotations

import os
import subprocess
import time

from trialbox.errors import SandboxStartError

UNSHARE = "/usr/bin/unshare"
MAPPED = 65_536
"""Container uids (and gids) 0..MAPPED-1 are mapped: a block of uids.py."""


def make_userns(owner: int, base: int, count: int = MAPPED, net: bool = False,
                timeout_s: float = 5.0) -> tuple[int, int]:
    """Fds of a new user namespace owned by host uid `owner` (made by a helper running
    as that uid, with no groups) whose uids and gids 0..count-1 are host `base...`, and
    with `net` of a network namespace it owns (else -1): a container that joins the user
    namespace can join only network namespaces owned by it. The helper is killed once
    they are open; the fds keep them alive (a bundle joins them by
    `/proc/<pid>/fd/<fd>`)."""
    helper = subprocess.Popen([UNSHARE, "--user", *(["--net"] if net else []),
                               "/bin/sleep", "60"], user=owner,
                              group=owner, extra_groups=[], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              close_fds=True, start_new_session=True, cwd="/")
    try:
        ours = os.stat("/proc/self/ns/user").st_ino
        deadline = time.monotonic() + timeout_s
        while True:  # unshare has run once the helper's namespace is not ours
            try:
                if os.stat(f"/proc/{helper.pid}/ns/user").st_ino != ours:
                    break
            except FileNotFoundError:
                pass
            if helper.poll() is not None:
                err = helper.stderr.read().decode(errors="replace") if helper.stderr else ""
                raise SandboxStartError(f"could not make a user namespace as uid {owner}: "
                                        f"{err.strip() or helper.returncode}")
            if time.monotonic() > deadline:
                raise SandboxStartError(f"no user namespace from uid {owner} within "
                                        f"{timeout_s:g} s")
            time.sleep(0.0005)
        for name in ("uid_map", "gid_map"):
            fd = os.open(f"/proc/{helper.pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, f"0 {base} {count}\n".encode())
            finally:
                os.close(fd)
        user = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        if not net:
            return user, -1
        try:
            return user, os.open(f"/proc/{helper.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(user)
            raise
    finally:
        helper.kill()
        helper.wait()
        if helper.stderr is not None:
            helper.stderr.close()
