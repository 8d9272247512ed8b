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
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_filter(denied: dict[str, int] | None = None) -> bytes:
    """The BPF program (a sequence of 8-byte `sock_filter`s) for x86_64.

    Layout: check arch (anything but x86_64 is killed: no i386/x32 side doors), load the
    syscall number, EPERM for the x32 ABI bit and each denied number, inspect clone()'s
    flags for namespace bits, ENOSYS for clone3 (glibc then falls back to clone), allow.
    """
    if platform.machine() != "x86_64":
        raise SandboxUnavailable(
            f"the namespace tier's seccomp filter is written for x86_64, this host is "
            f"{platform.machine()}; add its syscall table to trialbox/sandbox/seccomp.py")
    nrs = sorted(set((denied or DENIED_X86_64).values()))
    # Instruction indexes of the shared tails, counted from the layout below.
    head = 5  # ld arch, jeq, ret kill, ld nr, jge x32
    n_deny = len(nrs)
    i_clone = head + n_deny          # jeq clone
    i_clone3 = i_clone + 1           # jeq clone3
    i_allow = i_clone3 + 1           # ret allow
    i_clone_chk = i_allow + 1        # ld arg0; jset mask
    i_deny = i_clone_chk + 2         # ret EPERM
    i_enosys = i_deny + 1            # ret ENOSYS
    i_allow2 = i_enosys + 1          # ret allow

    def rel(at: int, target: int) -> int:
        off = target - (at + 1)
        assert 0 <= off <= 255, (at, target)
        return off

    prog = [
        _insn(BPF_LD_W_ABS, 0, 0, OFF_ARCH),
        _insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        _insn(BPF_LD_W_ABS, 0, 0, OFF_NR),
        _insn(BPF_JGE_K, rel(4, i_deny), 0, X32_SYSCALL_BIT),
    ]
    for j, nr in enumerate(nrs):
        at = head + j
        prog.append(_insn(BPF_JEQ_K, rel(at, i_deny), 0, nr))
    prog.append(_insn(BPF_JEQ_K, rel(i_clone, i_clone_chk), 0, X86_64_CLONE))
    prog.append(_insn(BPF_JEQ_K, rel(i_clone3, i_enosys), 0, X86_64_CLONE3))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_ARG0_LO))
    prog.append(_insn(BPF_JSET_K, 0, rel(i_clone_chk + 1, i_allow2), CLONE_NS_MASK))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS))
    prog.append(_insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    assert len(prog) == i_allow2 + 1
    return b"".join(prog)
