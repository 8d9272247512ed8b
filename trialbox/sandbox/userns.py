"""A host uid range of its own for each container session, and the user namespace that
maps it, owned by an unprivileged host uid (the `container` tier: oci.py).

Per-user kernel budgets are charged by host uid: pipe-buffer pages to a process's uid,
and inotify instances, POSIX message queue bytes and the like to its uid in its user
namespace *and to the owner of every user namespace above it*. runc and crun create the
container's user namespace as host root, so before this every container session charged
host root and shared one uid range with every other session: 128 inotify instances in
one sandbox made host root's `inotify_init1` fail (EMFILE), and one session's pipes
shrank everyone's. Now each session

* leases a slot `k` (`UidLease`): host uids `base + k * SLOT_SIZE ...` for its
  container's 0..65535 — unique on the node across processes (an exclusive `flock` on
  `<lock_dir>/<k>`: the kernel drops it when the holder dies, so a crashed supervisor's
  slots are free again, and its containers died with it: their fork servers exit on
  the EOF of their control sockets);
* has its container join a user namespace made here (`make_userns`) by a helper running
  as the slot's first uid (the container's root), so that uid, not host root, is the
  namespace's owner and pays for what the sandbox holds.

Slots sit in their own range (`OciConfig.uid_base`, far above the namespace tier's
`PoolConfig.uid_base`), so the two tiers never hand out the same host uid.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import time

from trialbox.errors import SandboxStartError

SLOT_SIZE = 65_536
"""Host uids per session: the container's uids 0..65535."""
UNSHARE = "/usr/bin/unshare"


class UidLease:
    """One slot of `slots` held by this process until `release` (or its death).

        lease = UidLease.take("/run/trialbox-oci-uids", base=1_500_000_000, slots=1024)
        lease.base   # host uid of the container's uid 0
    """

    def __init__(self, fd: int, slot: int, base: int):
        self.fd, self.slot = fd, slot
        self.base = base + slot * SLOT_SIZE
        """Host uid that the container's uid 0 maps to."""

    @classmethod
    def take(cls, lock_dir: str, base: int, slots: int, start: int = 0) -> UidLease:
        """The first free slot from `start` on (wrapping): SandboxStartError when all
        `slots` are held (by this process or others)."""
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        for i in range(slots):
            slot = (start + i) % slots
            fd = os.open(os.path.join(lock_dir, str(slot)),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                continue
            return cls(fd, slot, base)
        raise SandboxStartError(f"every container uid slot ({slots}) is held on this "
                                "node; close sessions or raise OciConfig.uid_slots")

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # drops the flock
            self.fd = -1


def make_userns(owner: int, base: int, count: int = SLOT_SIZE, net: bool = False,
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
