"""The seccomp deny-list, assembled as a classic BPF program.

The supervisor builds the program once (pure Python, testable here) and hands the bytes
to the zygote, which loads it in each sandbox with `prctl(PR_SET_SECCOMP)` right before
the candidate's first instruction (after `no_new_privs`). A denied syscall fails with
EPERM instead of killing the process, so programs see an ordinary error.

Why a deny-list and not an allow-list: candidates run arbitrary languages and toolchains
(gcc, bash, Python C extensions); the deny-list removes what an unprivileged process in
fresh namespaces could still use to attack the kernel or escape — tracing, mounting,
namespaces, keyrings, BPF, perf, io_uring (which bypasses seccomp), module and kexec
loading — while leaving ordinary programs untouched.
"""

from __future__ import annotations

import errno
import platform
import struct

from trialbox.errors import SandboxUnavailable

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_RET_K = 0x06
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# struct seccomp_data offsets: int nr; u32 arch; u64 ip; u64 args[6]
OFF_NR, OFF_ARCH, OFF_ARG0_LO = 0, 4, 16

# Namespace flags a clone() may not carry (CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|
# NEWPID|NEWNET|NEWTIME).
CLONE_NS_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000 | 0x00000080

X86_64_CLONE = 56
X86_64_CLONE3 = 435

# name -> x86_64 syscall number
DENIED_X86_64: dict[str, int] = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "process_madvise": 440, "kcmp": 312, "pidfd_getfd": 438,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442,
    "unshare": 272, "setns": 308,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170,
    "setdomainname": 171, "iopl": 172, "ioperm": 173, "modify_ldt": 154,
    "create_module": 174, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "get_kernel_syms": 177, "query_module": 178, "quotactl": 179, "quotactl_fd": 443,
    "nfsservctl": 180, "kexec_load": 246, "kexec_file_load": 320,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "lookup_dcookie": 212,
    "acct": 163, "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305,
    "adjtimex": 159, "syslog": 103, "vhangup": 153, "uselib": 134, "_sysctl": 156,
    "fanotify_init": 300, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "move_pages": 279, "migrate_pages": 256,
    "cachestat": 451,  # page-cache residency of any file it can open (see RWF_NOWAIT)
}


# Socket families a program may create (socket, socketpair): local, IPv4, IPv6 and
# netlink (libc asks it for interface addresses). Everything else — AF_VSOCK (not
# namespaced: it reaches the host's vsock ports), AF_PACKET, AF_ALG, AF_BLUETOOTH,
# AF_XDP... — fails with EAFNOSUPPORT, as in a kernel built without it.
ALLOWED_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
AF_NETLINK = 16
# Netlink's kernel uevents (NETLINK_KOBJECT_UEVENT) are broadcast to every network
# namespace owned by the host's user namespace, as the cells' are: a sandbox listening
# saw the host's device events. EPROTONOSUPPORT, as in a kernel without it; every other
# netlink protocol answers only about the cell's own namespaces.
NETLINK_KOBJECT_UEVENT = 15
OFF_ARG2_LO = OFF_ARG0_LO + 2 * 8
X86_64_SOCKET = 41
X86_64_SOCKETPAIR = 53
# preadv2/pwritev2 with RWF_NOWAIT say whether a file's pages are in the page cache,
# which the host shares with every sandbox (a probe of what others ran): the flag
# fails with EOPNOTSUPP, as on a filesystem without it; the calls work without it.
X86_64_PREADV2 = 327
X86_64_PWRITEV2 = 328
RWF_NOWAIT = 0x00000008
OFF_ARG5_LO = OFF_ARG0_LO + 5 * 8
# ENOSYS, so callers fall back as on a kernel without them: clone3 (glibc then uses
# clone, whose flags are checked) and kernel AIO (io_submit also takes RWF_NOWAIT).
ENOSYS_X86_64: dict[str, int] = {"clone3": X86_64_CLONE3, "io_setup": 206}
# Calls that succeed without doing anything (SECCOMP_RET_ERRNO with errno 0 returns 0 and
# skips the call): what they would do is host-wide and charged to nobody. sync() writes
# back every host filesystem; syncfs(fd) the filesystem of any file it can open (the
# host's root, under /usr). A sandbox's own files are tmpfs, where both do nothing
# anyway, so programs that sync see what they would see.
NOOP_X86_64: dict[str, int] = {"sync": 162, "syncfs": 306}
# posix_fadvise(POSIX_FADV_DONTNEED) drops a file's clean pages from the page cache, which
# every sandbox shares with the host: over the runtime (/usr) it flushed the host's cache
# of it, the first half of a flush+reload probe. On a sandbox's own (tmpfs) files it does
# nothing anyway; it returns 0 without effect. Every other advice works.
X86_64_FADVISE64 = 221
POSIX_FADV_DONTNEED = 4
OFF_ARG3_LO = OFF_ARG0_LO + 3 * 8


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_filter(denied: dict[str, int] | None = None) -> bytes:
    """The BPF program (a sequence of 8-byte `sock_filter`s) for x86_64.

    Layout: check arch (anything but x86_64 is killed: no i386/x32 side doors), load the
    syscall number, EPERM for the x32 ABI bit and each denied number, ENOSYS for clone3
    and io_setup, 0 without effect for sync and syncfs, then the calls whose arguments
    decide: clone()'s flags (no namespace bits), socket()/socketpair()'s family
    (ALLOWED_FAMILIES; for netlink, no NETLINK_KOBJECT_UEVENT), preadv2()/pwritev2()'s
    flags (no RWF_NOWAIT), fadvise64's advice (DONTNEED: 0 without effect); allow
    everything else.
    """
    if platform.machine() != "x86_64":
        raise SandboxUnavailable(
            f"the namespace tier's seccomp filter is written for x86_64, this host is "
            f"{platform.machine()}; add its syscall table to trialbox/sandbox/seccomp.py")
    nrs = sorted(set((denied or DENIED_X86_64).values()))
    enosys = sorted(set(ENOSYS_X86_64.values()))
    noop = sorted(set(NOOP_X86_64.values()))
    # Assembled with symbolic targets, resolved once every label's index is known.
    prog: list[tuple[int, int | str, int | str, int]] = []
    labels: dict[str, int] = {}

    def emit(code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        prog.append((code, jt, jf, k))

    def label(name: str) -> None:
        labels[name] = len(prog)

    emit(BPF_LD_W_ABS, OFF_ARCH)
    emit(BPF_JEQ_K, AUDIT_ARCH_X86_64, jt=1)
    emit(BPF_RET_K, SECCOMP_RET_KILL_PROCESS)
    emit(BPF_LD_W_ABS, OFF_NR)
    emit(BPF_JGE_K, X32_SYSCALL_BIT, jt="deny")
    for nr in nrs:
        emit(BPF_JEQ_K, nr, jt="deny")
    for nr in enosys:
        emit(BPF_JEQ_K, nr, jt="enosys")
    for nr in noop:
        emit(BPF_JEQ_K, nr, jt="noop")
    emit(BPF_JEQ_K, X86_64_CLONE, jt="clone")
    emit(BPF_JEQ_K, X86_64_SOCKET, jt="family")
    emit(BPF_JEQ_K, X86_64_SOCKETPAIR, jt="family")
    emit(BPF_JEQ_K, X86_64_PREADV2, jt="rwf")
    emit(BPF_JEQ_K, X86_64_PWRITEV2, jt="rwf")
    emit(BPF_JEQ_K, X86_64_FADVISE64, jt="fadvise")
    emit(BPF_RET_K, SECCOMP_RET_ALLOW)
    label("fadvise")
    emit(BPF_LD_W_ABS, OFF_ARG3_LO)
    emit(BPF_JEQ_K, POSIX_FADV_DONTNEED, jt="noop", jf="allow")
    label("clone")
    emit(BPF_LD_W_ABS, OFF_ARG0_LO)
    emit(BPF_JSET_K, CLONE_NS_MASK, jt="deny", jf="allow")
    label("family")
    emit(BPF_LD_W_ABS, OFF_ARG0_LO)
    emit(BPF_JEQ_K, AF_NETLINK, jt="netlink")
    for family in ALLOWED_FAMILIES:
        emit(BPF_JEQ_K, family, jt="allow")
    emit(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT)
    label("netlink")
    emit(BPF_LD_W_ABS, OFF_ARG2_LO)
    emit(BPF_JEQ_K, NETLINK_KOBJECT_UEVENT, jf="allow")
    emit(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EPROTONOSUPPORT)
    label("rwf")
    emit(BPF_LD_W_ABS, OFF_ARG5_LO)
    emit(BPF_JSET_K, RWF_NOWAIT, jt="eopnotsupp", jf="allow")
    label("eopnotsupp")
    emit(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EOPNOTSUPP)
    label("deny")
    emit(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EPERM)
    label("enosys")
    emit(BPF_RET_K, SECCOMP_RET_ERRNO | errno.ENOSYS)
    label("noop")
    emit(BPF_RET_K, SECCOMP_RET_ERRNO | 0)
    label("allow")
    emit(BPF_RET_K, SECCOMP_RET_ALLOW)

    def rel(at: int, target: int | str) -> int:
        off = labels[target] - (at + 1) if isinstance(target, str) else target
        assert 0 <= off <= 255, (at, target)
        return off

    return b"".join(_insn(code, rel(i, jt), rel(i, jf), k)
                    for i, (code, jt, jf, k) in enumerate(prog))
