"""`trialbox demo sandbox` — the showcase of the layers under training: untrusted
programs, good and hostile, run in the namespace sandbox and reported exactly; then the
trusted judge grading honest, wrong and cheating solutions of a HumanEval task.

`trialbox demo` (make demo) is the training demo: trialbox/train/demo_run.py.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass

from trialbox.sandbox import CellPool, NamespaceSandbox, PoolConfig, run_code
from trialbox.types import ExecResult, Limits


@dataclass(frozen=True)
class Case:
    title: str
    lang: str
    code: str
    expect: str
    limits: Limits = Limits(wall_s=3, cpu_s=3, memory_mb=128, disk_mb=32,
                            output_bytes=64 * 1024, pids=32)
    stdin: bytes = b""


CASES = [
    Case("correct answer (Python)", "python",
         "n = int(input())\nprint(sum(i * i for i in range(n)))", "ok", stdin=b"1000\n"),
    Case("correct answer (C, compiled in the sandbox)", "c",
         '#include <stdio.h>\nint main(){long s=0;for(int i=0;i<1000;i++)s+=(long)i*i;'
         'printf("%ld\\n",s);return 0;}', "ok"),
    Case("wrong answer: crashes", "python", "def f(x):\n    return x[3]\nprint(f([1]))",
         "exit"),
    Case("segfault (C)", "c", "int main(){int *p=0; return *p;}", "signal"),
    Case("infinite loop", "python", "while True:\n    pass", "timeout",
         Limits(wall_s=5, cpu_s=1, memory_mb=128, disk_mb=32)),
    Case("sleeps forever", "python", "import time\ntime.sleep(10**6)", "timeout",
         Limits(wall_s=1, memory_mb=128, disk_mb=32)),
    Case("memory bomb", "python", "b = []\nwhile True:\n    b.append(b'x' * 10**7)",
         "memory", Limits(wall_s=5, memory_mb=64, disk_mb=32)),
    Case("fork bomb", "bash", ":(){ :|:& };:\nsleep 5", "timeout",
         Limits(wall_s=1.5, memory_mb=128, disk_mb=32, pids=32)),
    Case("stdout flood (gigabytes)", "bash", "yes trialbox", "output"),
    Case("fills its disk", "bash", "dd if=/dev/zero of=big bs=1M count=100", "disk"),
    Case("reads host secrets", "bash",
         "cat /etc/shadow; ls /root; ls /work; env | grep -i -e key -e token -e secret"
         "; echo done", "ok"),
    Case("network egress", "python",
         "import socket\ns = socket.socket()\ns.settimeout(1)\n"
         "try:\n    s.connect(('1.1.1.1', 53)); print('CONNECTED')\n"
         "except OSError as e:\n    print('blocked:', e)", "ok"),
    Case("kill -9 -1, then ptrace of its parent", "python",
         "import os, ctypes, signal\n"
         "try:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "r = libc.ptrace(16, os.getppid(), 0, 0)\n"
         "print('ptrace:', r, os.strerror(ctypes.get_errno()))", "ok"),
    Case("privileged syscalls", "python",
         "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
         "for name, args in [('mount', (b'none', b'/tmp', b'tmpfs', 0, None)),\n"
         "                   ('unshare', (0x10000000,)), ('sethostname', (b'x', 1))]:\n"
         "    r = getattr(libc, name)(*args)\n"
         "    print(name, r, os.strerror(ctypes.get_errno()))", "ok"),
]


def _row(title: str, r: ExecResult, expect: str, color: bool) -> str:
    ok = r.status.value == expect
    mark = ("\x1b[32m✔\x1b[0m" if ok else "\x1b[31m✘\x1b[0m") if color else \
        ("ok " if ok else "BAD")
    out = (r.stdout_text or r.stderr_text).strip().replace("\n", " | ")
    if len(out) > 60:
        out = out[:57] + "..."
    return (f" {mark} {title:<42} {r.status.value:<8} {r.wall_ms:8.1f} {r.cpu_ms:8.1f} "
            f"{r.peak_memory_bytes / 2**20:7.1f}  {out or r.message}")


async def _main() -> int:
    color = sys.stdout.isatty()
    print("trialbox demo — untrusted programs in the namespace sandbox "
          "(user/pid/mount/net/ipc/uts namespaces, cgroups, seccomp, read-only root)\n")
    t0 = time.monotonic()
    pool = await CellPool(PoolConfig()).start()
    print(f" pool ready in {(time.monotonic() - t0) * 1e3:.0f} ms; runtime "
          f"{pool.runtime.name} ({pool.runtime.python} {pool.runtime.version})\n")
    print(f"   {'program':<42} {'status':<8} {'wall ms':>8} {'cpu ms':>8} {'MiB':>7}  "
          "what it printed / why")
    bad = 0
    try:
        for case in CASES:
            async with await NamespaceSandbox.open(pool, case.limits) as sb:
                r = await run_code(sb, case.code, case.lang, stdin=case.stdin)
            bad += r.status.value != case.expect
            print(_row(case.title, r, case.expect, color), flush=True)

        print("\n a multi-turn session: files persist across runs, processes do not")
        async with await NamespaceSandbox.open(pool) as sb:
            await sb.write_file("solution.py", b"def add(a, b):\n    return a - b\n")
            r1 = await sb.exec(["python3", "-c", "from solution import add; print(add(2, 3))"])
            await sb.write_file("solution.py", b"def add(a, b):\n    return a + b\n")
            r2 = await sb.exec(["python3", "-c", "from solution import add; print(add(2, 3))"])
            print(f"   turn 1: add(2, 3) -> {r1.stdout_text.strip()}   (bug)\n"
                  f"   turn 2: add(2, 3) -> {r2.stdout_text.strip()}   (fixed; files kept)")
            bad += r1.stdout != b"-1\n" or r2.stdout != b"5\n"

            lat = []
            await sb.write_file("t.py", b"import time\nprint(time.monotonic_ns())\n")
            for _ in range(30):
                await asyncio.sleep(0.02)  # an agent thinks between turns
                t = time.monotonic_ns()
                r = await sb.exec(["python3", "t.py"])
                lat.append((int(r.stdout) - t) / 1e6)
        print(f"\n start to first instruction of a Python program: p50 "
              f"{statistics.median(lat):.2f} ms over {len(lat)} runs "
              "(a fresh `python3 -c` is ~10-15 ms here; `make bench` measures it)")
        bad += await _judge_showcase(color)
    finally:
        await pool.close()
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _is_sandbox(p, pool)]
    print(f" after shutdown: {len(leftover)} sandbox processes left on the host")
    print("\n" + ("every program got the status it earned" if not bad else
                  f"{bad} program(s) got an unexpected status"))
    return 1 if bad or leftover else 0


JUDGE_CASES = [
    ("the reference solution", None, "passed"),
    ("a wrong shortcut", "    return len(numbers) > 1\n", "failed"),
    ("an always-equal object", "    class Eq:\n        def __eq__(self, o): return True\n"
     "    return Eq()\n", "failed"),
    ("exits before the tests run", "    pass\nimport sys\nsys.exit(0)\n", "failed"),
    ("prints a fake success", "    print('All 7 tests passed')\n    return True\n", "failed"),
    ("loops forever", "    while True:\n        pass\n", "timeout"),
]
"""What each completion earns. The attacks fail by the tests, which run outside the
candidate; their anti-cheat flags are shown beside the status (notable, never a
verdict: docs/judge.md, "Flags and evidence")."""


async def _judge_showcase(color: bool) -> int:
    """HumanEval/0 graded by the trusted judge: the tests run in a sandbox of their own
    and call the candidate through a plain-data proxy."""
    from trialbox.judge.evaluate import reward_of
    from trialbox.judge.function import JudgeConfig, judge_function, judge_pool_config
    from trialbox.store.tasks import load_humaneval
    task = next(t for t in load_humaneval() if t.task_id == "HumanEval/0")
    config = JudgeConfig(call_timeout_s=1.0)
    print(f"\n the trusted judge on {task.task_id} ({task.entry_point}, "
          f"{len(task.hidden_tests)} hidden tests run outside the candidate):")
    bad = 0
    pool = await CellPool(judge_pool_config(warm=2)).start()
    try:
        for title, completion, expect in JUDGE_CASES:
            g = await judge_function(task, completion or task.canonical_solution, pool,
                                     config)
            ok = g.outcome.value == expect
            bad += not ok
            mark = ("\x1b[32m✔\x1b[0m" if ok else "\x1b[31m✘\x1b[0m") if color else \
                ("ok " if ok else "BAD")
            passed = sum(t.passed for t in g.tests)
            flags = f" [{', '.join(g.flags)}]" if g.flags else ""
            print(f" {mark} {title:<28} {g.outcome.value:<8} reward {reward_of(g)!s:<4} "
                  f"tests {passed}/{len(g.tests)}{flags}  {g.message[:60]}")
    finally:
        await pool.close()
    return bad


def _is_sandbox(pid: str, pool: CellPool) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return pool.id in f.read()
    except OSError:
        return False


def main() -> int:
    return asyncio.run(_main())
