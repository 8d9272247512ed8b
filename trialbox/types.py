"""The vocabulary: frozen records shared by every layer. No behaviour beyond validation.

Later layers (judge, scheduler, trainer) add their records here too; the sandbox layer
needs `Limits`, `ExecStatus`, `ExecResult` and `Runtime`.
"""

from __future__ import annotations

import base64
import enum
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from trialbox.errors import LimitsError

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """What one run (and its session's workspace) may use. All enforced from outside.

    Defaults are sized for a 2-core, 24 GiB machine running several sandboxes at once.
    The seeds' per-task reference quota is `Limits.reference()` (2 vCPU / 4 GB / 50 GB).

    >>> Limits(wall_s=2, memory_mb=256).memory_bytes
    268435456
    """

    wall_s: float = 10.0
    """Wall-clock time for one run, measured by the supervisor; then everything is killed."""
    cpu_s: float = 10.0
    """CPU time for one run (all its processes), from cgroup accounting and RLIMIT_CPU."""
    memory_mb: int = 512
    """Memory for one run (all its processes, page cache included), a cgroup limit."""
    pids: int = 64
    """Processes plus threads alive at once in one run (cgroup pids controller)."""
    disk_mb: int = 256
    """Size of the session's private tmpfs (workspace, /tmp, /dev/shm together)."""
    output_bytes: int = 1 * MiB
    """Bytes kept from each of stdout and stderr; more kills the run (status `output`)."""
    open_files: int = 256
    """RLIMIT_NOFILE: open file descriptors per process."""
    cpus: float = 1.0
    """CPU bandwidth: how many cores' worth of time the run may use at once."""
    network: bool = False
    """Give the run the host's network. Off: a private network namespace with only `lo`."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "network":
                if not isinstance(value, bool):
                    raise LimitsError(f"Limits.network must be True or False, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise LimitsError(f"Limits.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise LimitsError(
                    f"Limits.{f.name} must be a positive finite number, got {value!r}; "
                    f"use a value above 0 (default {f.default!r})"
                )
        caps = {"wall_s": 86400, "cpu_s": 86400, "pids": 65536, "open_files": 1 << 20,
                "cpus": 1024, "memory_mb": 1 << 24, "disk_mb": 1 << 24,
                "output_bytes": 1 << 34}
        for name, cap in caps.items():
            if getattr(self, name) > cap:
                raise LimitsError(f"Limits.{name}={getattr(self, name)!r} is above the "
                                  f"maximum {cap}; lower it")
        if self.memory_mb < 16:
            raise LimitsError(f"Limits.memory_mb={self.memory_mb} is too small to start an "
                              "interpreter; use at least 16")
        if self.pids < 4:
            raise LimitsError(f"Limits.pids={self.pids} is too small; use at least 4")
        if self.open_files < 16:
            raise LimitsError(f"Limits.open_files={self.open_files} is too small; "
                              "use at least 16")
        if self.output_bytes < 1024:
            raise LimitsError(f"Limits.output_bytes={self.output_bytes} is too small; "
                              "use at least 1024")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mb * MiB)

    @property
    def disk_bytes(self) -> int:
        return int(self.disk_mb * MiB)

    @classmethod
    def reference(cls) -> Limits:
        """The seeds' per-task reference quota: 2 vCPU, 4 GB memory, 50 GB temp storage."""
        return cls(cpus=2.0, memory_mb=4096, disk_mb=50 * 1024, wall_s=600.0, cpu_s=1200.0,
                   pids=512)

    def with_(self, **changes: Any) -> Limits:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


class ExecStatus(enum.Enum):
    """How a run ended. Every value but `INFRA` is something the candidate did."""

    OK = "ok"
    """Exited with status 0."""
    EXIT = "exit"
    """Exited with a non-zero status."""
    SIGNAL = "signal"
    """Killed by a signal it caused (segfault, abort, its own kill)."""
    TIMEOUT = "timeout"
    """Ran past its wall-clock or CPU-time limit and was killed."""
    MEMORY = "memory"
    """Hit its memory limit (the cgroup's OOM killer fired)."""
    OUTPUT = "output"
    """Wrote more than `Limits.output_bytes` to stdout or stderr and was killed."""
    DISK = "disk"
    """Filled its workspace (the session tmpfs is full)."""
    INFRA = "infra"
    """The sandbox machinery failed before or around the candidate: not its fault."""


@dataclass(frozen=True)
class Runtime:
    """The declared environment a candidate runs against (never the project's venv)."""

    name: str
    """Short id recorded with each result, e.g. `python3.11-system`."""
    python: str
    """Absolute path of the interpreter inside the sandbox view."""
    version: str
    """Interpreter version, e.g. `3.11.2`."""
    digest: str = ""
    """sha256 of the interpreter binary, so a result names exactly what ran."""

    @property
    def id(self) -> str:
        """What results record: `python3.11-system@sha256:0123456789abcdef`."""
        return f"{self.name}@sha256:{self.digest[:16]}" if self.digest else self.name


@dataclass(frozen=True)
class ExecResult:
    """What one run did, measured from outside the candidate."""

    status: ExecStatus
    exit_code: int | None = None
    """The exit status when the process exited; None when killed by a signal."""
    signal: int | None = None
    """The signal number when killed by one (ours for timeout/output, or its own)."""
    stdout: bytes = b""
    stderr: bytes = b""
    truncated: bool = False
    """True when stdout or stderr was cut at `Limits.output_bytes`."""
    wall_ms: float = 0.0
    """Supervisor's clock from release of the run to the end of all its processes."""
    cpu_ms: float = 0.0
    """CPU time of every process in the run, from cgroup accounting."""
    peak_memory_bytes: int = 0
    """Peak memory of the run's cgroup."""
    message: str = ""
    """Why, in words, when the status is not `ok` (limit hit, infra cause)."""
    runtime: str = ""
    """`Runtime.id` of the environment that ran the code (name and interpreter hash)."""
    tier: str = ""
    """Isolation tier that ran it, e.g. `namespace`."""
    compile: ExecResult | None = field(default=None)
    """For compiled languages: the compiler's run (the program runs only if it succeeded)."""

    @property
    def ok(self) -> bool:
        return self.status is ExecStatus.OK

    @property
    def stdout_text(self) -> str:
        """stdout decoded leniently (invalid UTF-8 becomes U+FFFD); bytes stay in `stdout`."""
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: text fields decoded leniently, raw bytes in base64."""
        out = asdict(self)
        out["status"] = self.status.value
        out["stdout"] = self.stdout_text
        out["stderr"] = self.stderr_text
        out["stdout_b64"] = base64.b64encode(self.stdout).decode()
        out["stderr_b64"] = base64.b64encode(self.stderr).decode()
        out["compile"] = self.compile.to_json() if self.compile else None
        return out
