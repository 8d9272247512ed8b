"""The seccomp program: well-formed BPF, every denied syscall in it, the arch checked."""

import struct

from trialbox.sandbox.seccomp import (
    AUDIT_ARCH_X86_64,
    BPF_JEQ_K,
    BPF_RET_K,
    DENIED_X86_64,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_KILL_PROCESS,
    build_filter,
)


def _insns(prog):
    return [struct.unpack("HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]


def test_filter_is_whole_instructions_and_checks_arch_first():
    prog = build_filter()
    assert len(prog) % 8 == 0
    ins = _insns(prog)
    assert ins[1] == (BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64)
    assert ins[2] == (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)
    assert ins[-1][3] == SECCOMP_RET_ALLOW
    assert len(ins) < 4096  # BPF_MAXINSNS


def test_every_denied_syscall_is_matched_and_jumps_in_range():
    ins = _insns(build_filter())
    matched = {k for code, jt, jf, k in ins if code == BPF_JEQ_K}
    for name in ("ptrace", "mount", "unshare", "setns", "keyctl", "bpf", "perf_event_open",
                 "kexec_load", "init_module", "finit_module", "io_uring_setup"):
        assert DENIED_X86_64[name] in matched, name
    for i, (code, jt, jf, _k) in enumerate(ins):
        if code & 0x07 == 0x05:  # BPF_JMP
            assert i + 1 + jt < len(ins) and i + 1 + jf < len(ins)
