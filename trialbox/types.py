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

from trialbox.errors import LimitsError, UsageError

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
    net_allow: tuple[str, ...] = ()
    """TCP endpoints the session may connect to, `ADDR[/PREFIX]:PORT` (`[ADDR]:PORT` for
    IPv6), e.g. `("10.0.0.5:3141", "10.1.0.0/24:443")`; everything else is refused and
    counted (sandbox/network.py). Fixed when the session opens. Empty: no network."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "network":
                if not isinstance(value, bool):
                    raise LimitsError(f"Limits.network must be True or False, got {value!r}")
                continue
            if f.name == "net_allow":
                object.__setattr__(self, "net_allow", _check_net_allow(value))
                if self.net_allow and self.network:
                    raise LimitsError(
                        "Limits.network=True gives the host's whole network and "
                        "Limits.net_allow narrows a private one: set only one of them")
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


def parse_endpoint(entry: str) -> tuple[str, int]:
    """`ADDR[/PREFIX]:PORT` or `[ADDR[/PREFIX]]:PORT` -> (network as text, port), checked.

    >>> parse_endpoint("10.1.0.0/24:443")
    ('10.1.0.0/24', 443)
    >>> parse_endpoint("[fd00::5]:80")
    ('fd00::5/128', 80)
    """
    import ipaddress
    form = ("use 'ADDR[/PREFIX]:PORT', e.g. '10.0.0.5:3141' or '10.1.0.0/24:443' "
            "('[fd00::5]:80' for IPv6)")
    if not isinstance(entry, str):
        raise LimitsError(f"Limits.net_allow entry {entry!r} is not a string; {form}")
    host, sep, port_text = entry.rpartition(":")
    if not sep or not host:
        raise LimitsError(f"Limits.net_allow entry {entry!r} has no port; {form}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise LimitsError(f"Limits.net_allow entry {entry!r}: put an IPv6 address in "
                          f"brackets; {form}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise LimitsError(f"Limits.net_allow entry {entry!r}: port {port_text!r} is not "
                          f"a number from 1 to 65535; {form}")
    try:
        net = ipaddress.ip_network(host, strict=True)
    except ValueError as e:
        raise LimitsError(f"Limits.net_allow entry {entry!r}: {e} (an address or "
                          f"network, no host names); {form}") from None
    if net.subnet_of(ipaddress.ip_network("127.0.0.0/8")  # type: ignore[arg-type]
                     if net.version == 4 else ipaddress.ip_network("::1/128")):
        raise LimitsError(f"Limits.net_allow entry {entry!r}: a sandbox's loopback is its "
                          "own (nothing on the host's is reachable there); allow an "
                          "address the host serves on another interface")
    return str(net), int(port_text)


def _check_net_allow(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise LimitsError(f"Limits.net_allow must be a tuple of 'ADDR[/PREFIX]:PORT' "
                          f"strings, got {value!r}; e.g. ('10.0.0.5:3141',)")
    if len(value) > 64:
        raise LimitsError(f"Limits.net_allow has {len(value)} entries; at most 64 "
                          "(use a network prefix to cover a range)")
    for entry in value:
        parse_endpoint(entry)
    return tuple(value)


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


# --------------------------------------------------------------------------- tasks

class TaskKind(enum.Enum):
    """What a task asks for and so how it is judged."""

    FUNCTION = "function"
    """Write a function (HumanEval style); tests call it through the judge's proxy."""
    STDIO = "stdio"
    """Write a program; each test feeds stdin and compares stdout outside the sandbox."""
    REPO = "repo"
    """Change a file tree; a trusted test command (e.g. pytest) decides."""


class Compare(enum.Enum):
    """How a stdio test's output is compared with the expected output."""

    EXACT = "exact"
    """Byte for byte."""
    WHITESPACE = "whitespace"
    """Equal after splitting on any whitespace (line ends and trailing spaces ignored)."""
    FLOAT = "float"
    """Token by token, by how the *expected* token is written: an integer compares exactly
    by value (`5` = `+5` = `5.0`, but 1000000000007 is not 1000000000000); a decimal
    (a point or an exponent) within `Task.float_tol`, absolute or relative; anything
    else (hex, inf, nan) must be the same bytes (judge/stdio.py `compare_output`)."""
    CHECKER = "checker"
    """A trusted checker program (`Task.checker`) decides."""


@dataclass(frozen=True)
class TestCase:
    """One unit of evidence. For FUNCTION tasks `code` is a statement the trusted harness
    runs with `candidate` bound to the proxy (e.g. `assert candidate(2) == 4`); for STDIO
    tasks `stdin` is fed to the program and its stdout compared with `expected`."""

    __test__ = False  # not a pytest test class

    name: str
    code: str = ""
    stdin: bytes = b""
    expected: bytes = b""


class Risk(enum.Enum):
    """How dangerous a task's candidate code is taken to be; `sandbox.tiers.TierPolicy`
    maps each level to an isolation tier (never a weaker one than configured)."""

    ROUTINE = "routine"
    """Model-written code for ordinary tasks: the fast wall (default `namespace`)."""
    UNTRUSTED = "untrusted"
    """Code from a source not trusted (another user's, red-team prompts): a kernel of its
    own (default `gvisor`)."""
    HOSTILE = "hostile"
    """Code expected to attack the sandbox (the hostile battery, exploit catalogues): the
    strongest wall the node has configured (default `gvisor`; a VM tier where one runs)."""


@dataclass(frozen=True)
class Task:
    """A problem to solve. `hidden_tests` never reach the policy's prompt or the
    candidate's sandbox; `visible_tests` may be shown (and their pass rate is reported
    apart, so special-casing them shows up as a gap)."""

    task_id: str
    kind: TaskKind
    prompt: str
    entry_point: str = ""
    """FUNCTION: the name of the function the candidate must define."""
    visible_tests: tuple[TestCase, ...] = ()
    hidden_tests: tuple[TestCase, ...] = ()
    test_setup: str = ""
    """FUNCTION: trusted code the harness runs once before the tests (imports, helpers)."""
    canonical_solution: str = ""
    """A reference solution (for FUNCTION tasks, appended to `prompt` like a completion)."""
    compare: Compare = Compare.EXACT
    float_tol: float = 1e-6
    checker: str = ""
    """CHECKER: a trusted Python program; argv: input, expected, actual files; exit 0 = pass."""
    files: tuple[tuple[str, bytes], ...] = ()
    """REPO: the starting file tree (path, content)."""
    test_command: tuple[str, ...] = ()
    """REPO: the trusted test command, run from outside the candidate's tree."""
    test_files: tuple[tuple[str, bytes], ...] = ()
    """REPO: trusted test files the policy may see (path in the tree, content); graded
    from this copy, never the candidate's."""
    hidden_test_files: tuple[tuple[str, bytes], ...] = ()
    """REPO: trusted test files never shown to the policy nor put in its sandbox."""
    source: str = ""
    """Where the task came from (data set name or file)."""
    canary: bool = False
    """Impossible by design (e.g. tests that contradict each other): any pass is a cheat.
    Mixed into a run to measure how often the policy games the judge."""
    risk: Risk = Risk.ROUTINE
    """Which isolation tier its candidates run in, through `sandbox.tiers.TierPolicy`."""
    net_allow: tuple[str, ...] = ()
    """Addresses its candidates' sandboxes may reach (`Limits.net_allow`: 'ADDR[/PREFIX]:
    PORT', e.g. a package mirror); empty: no network, the default."""
    image: str = ""
    """The environment it must run in: `name@sha256:<content hash or a prefix>` of a built
    image (docs/images.md), or "" for any. A sandbox on another environment refuses it."""


# --------------------------------------------------------------------------- grades

class Outcome(enum.Enum):
    """A graded attempt's outcome. Only INFRA (and ERROR, a broken test) are excluded
    from training (reward None); everything else is the candidate's doing."""

    PASSED = "passed"
    """Every test passed, on evidence produced outside the candidate."""
    FAILED = "failed"
    """At least one test failed (wrong answer, crash, bad return value)."""
    TIMEOUT = "timeout"
    """The candidate ran out of time (a call, or the whole attempt)."""
    MEMORY = "memory"
    """The candidate ran out of memory."""
    CHEAT = "cheat"
    """An anti-cheat detector fired; scores 0 whatever the tests said."""
    ERROR = "error"
    """The task's own test code failed (not the candidate's fault): excluded."""
    INFRA = "infra"
    """The machinery failed and retries did not help: excluded, never scored 0."""


@dataclass(frozen=True)
class TestResult:
    """The evidence for one test, produced by the trusted harness."""

    __test__ = False  # not a pytest test class

    name: str
    passed: bool
    message: str = ""
    """Why it failed, in words (assertion, candidate raised, timeout, bad return value)."""
    ms: float = 0.0
    hidden: bool = True


@dataclass(frozen=True)
class Grade:
    """A judged attempt: per-test evidence and the outcome that follows from it."""

    task_id: str
    outcome: Outcome
    tests: tuple[TestResult, ...] = ()
    message: str = ""
    flags: tuple[str, ...] = ()
    """Anti-cheat detectors that fired (names), and other notable signals."""
    wall_ms: float = 0.0
    candidate_cpu_ms: float = 0.0
    candidate_peak_memory_bytes: int = 0
    attempts: int = 1
    """How many times the machinery had to try (infra failures are retried)."""
    seed: int | None = None
    """The seed of the trusted test's `random` in the attempt graded (function tasks: a
    per-attempt secret); a re-grade given it sees the same draws."""

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED

    @property
    def pass_rate(self) -> float | None:
        """Fraction of tests passed; None when the attempt is excluded."""
        if self.outcome in (Outcome.INFRA, Outcome.ERROR):
            return None
        if not self.tests:
            return 0.0
        return sum(t.passed for t in self.tests) / len(self.tests)


# --------------------------------------------------------------------------- rollouts

@dataclass(frozen=True)
class Turn:
    """One model turn of an episode: what it generated, what ran, what it was told.

    The context the model saw is not repeated here: it is the trajectory's prompt plus
    the earlier turns' output and feedback tokens."""

    output_text: str
    """The generated text (the decoding of `output_ids`)."""
    output_ids: tuple[int, ...]
    """Exactly the token ids the policy generated (never re-tokenised), EOS included."""
    logprobs: tuple[float, ...]
    """Log-probability of each output token under the distribution it was sampled from."""
    code: str | None = None
    """The code extracted from the output; None when there was none."""
    code_from: str = ""
    """Where `code` came from: "fenced" (a ```python block), "raw" (the whole output), or
    "" (no code)."""
    exec_status: ExecStatus | None = None
    """How running the code in the episode's sandbox ended (None: nothing was run)."""
    exec_summary: str = ""
    """A compact account of that run (status, exit code, stderr tail)."""
    outcome: Outcome | None = None
    """The judge's outcome for this turn's code (hidden and visible tests)."""
    feedback_text: str = ""
    """What the environment told the model after this turn ("" after the last turn)."""
    feedback_ids: tuple[int, ...] = ()
    """`feedback_text` tokenised: appended to the context, masked out of the loss."""
    finish_reason: str = ""
    """Why generation stopped: "stop" (a stop string), "eos" or "length"."""
    gen_s: float = 0.0
    """Wall time of the generate call that produced this turn (shared by its batch)."""
    env_s: float = 0.0
    """Wall time spent executing and judging this turn's code."""

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.logprobs):
            raise UsageError(f"Turn: {len(self.output_ids)} output_ids but "
                             f"{len(self.logprobs)} logprobs; give one log-prob per token")
        if self.code_from not in ("fenced", "raw", ""):
            raise UsageError(f"Turn.code_from must be 'fenced', 'raw' or '', got "
                             f"{self.code_from!r}")


@dataclass(frozen=True)
class Trajectory:
    """One episode, token in / token out, ready for a policy-gradient step.

    `token_ids` = prompt_ids + for each turn (output_ids + feedback_ids), in order;
    `loss_mask` is 1 exactly on the output tokens; `old_logprobs` holds each output
    token's log-prob and 0.0 elsewhere. All three have the same length.

    >>> t = Turn("hi", (104, 105), (-0.5, -0.25), feedback_text="!", feedback_ids=(33,))
    >>> tr = Trajectory("t1", "t1#0", (1, 2), (t,), (1, 2, 104, 105, 33), (0, 0, 1, 1, 0),
    ...                 (0.0, 0.0, -0.5, -0.25, 0.0), reward=1.0)
    >>> tr.n_model_tokens
    2
    """

    task_id: str
    episode_id: str
    prompt_ids: tuple[int, ...]
    turns: tuple[Turn, ...]
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    old_logprobs: tuple[float, ...]
    reward: float | None
    """From the judge on the last turn's code; None = infrastructure failure (excluded
    from training, never scored 0.0)."""
    grade: Grade | None = None
    passed: bool = False
    group_id: str = ""
    """Samples of one group (same task, same rollout call) share it: GRPO normalises
    advantages within a group."""
    stop_reason: str = ""
    """Why the episode ended: "passed", "max_turns", "context" (no room left to
    generate), "infra" (the machinery failed: reward None), "task_error" (the task's
    own tests broke: reward None) or "session_broken" (the episode's own session failed
    while a control session ran fine: the candidate's doing, graded by the judge)."""
    gen_s: float = 0.0
    """Sum of the turns' generation time."""
    env_s: float = 0.0
    """Sum of the turns' environment time (execution and judging)."""
    environment: str = ""
    """`Runtime.id` of the environment its code ran and was judged in (an image's
    `image:<name>@sha256:<hash16>`, or the system interpreter's)."""
    policy_version: int | None = None
    """The trainer's version of the weights that sampled every output token (the number
    of update steps they had seen); None outside training. A batch trained at step s
    with version v is s - v steps stale (trialbox/train/pipeline.py)."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.old_logprobs) != n:
            raise UsageError(f"Trajectory {self.episode_id}: token_ids ({n}), loss_mask "
                             f"({len(self.loss_mask)}) and old_logprobs "
                             f"({len(self.old_logprobs)}) must have the same length")
        expected: list[int] = list(self.prompt_ids)
        mask: list[int] = [0] * len(self.prompt_ids)
        for turn in self.turns:
            expected += turn.output_ids
            expected += turn.feedback_ids
            mask += [1] * len(turn.output_ids) + [0] * len(turn.feedback_ids)
        if tuple(expected) != self.token_ids:
            raise UsageError(f"Trajectory {self.episode_id}: token_ids must be prompt_ids "
                             "followed by each turn's output_ids and feedback_ids, in order")
        if tuple(mask) != self.loss_mask:
            raise UsageError(f"Trajectory {self.episode_id}: loss_mask must be 1 exactly "
                             "on the turns' output tokens and 0 elsewhere")
        if self.reward is not None and not math.isfinite(self.reward):
            raise UsageError(f"Trajectory {self.episode_id}: reward must be finite or "
                             f"None, got {self.reward!r}")
        if self.policy_version is not None and self.policy_version < 0:
            raise UsageError(f"Trajectory {self.episode_id}: policy_version must be >= 0 "
                             f"or None, got {self.policy_version!r}")

    @property
    def n_model_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record (enums as their values)."""

        def plain(x: Any) -> Any:
            if isinstance(x, enum.Enum):
                return x.value
            if isinstance(x, dict):
                return {k: plain(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [plain(v) for v in x]
            return x

        out: dict[str, Any] = plain(asdict(self))
        out["n_model_tokens"] = self.n_model_tokens
        return out


# --------------------------------------------------------------------------- lifecycle

class TaskState(enum.Enum):
    """Where a task is in the scheduler. The legal moves between these states are one
    table, `trialbox.schedule.lifecycle.TRANSITIONS`; the last four are final."""

    PENDING = "pending"
    """Submitted and journaled; not yet in a queue."""
    QUEUED = "queued"
    """Waiting in a priority queue for a slot (holds nothing)."""
    GENERATING = "generating"
    """Holds a slot; the policy is writing. No sandbox compute is held."""
    EXECUTING = "executing"
    """Holds a slot and a sandbox lease: code runs."""
    GRADING = "grading"
    """The trusted judge is turning what happened into a reward."""
    RETRYING = "retrying"
    """The infrastructure failed; waiting out a backoff before going back to QUEUED."""
    PREEMPTED = "preempted"
    """Evicted for higher-priority work; goes back to QUEUED with its turns kept."""
    DONE = "done"
    """Final: graded, the reward is recorded."""
    FAILED = "failed"
    """Final: the infrastructure kept failing (retries spent) or the job itself broke;
    reward None (excluded), never 0.0."""
    TIMED_OUT = "timed_out"
    """Final: a turn or the whole task ran past its time limit; reward None."""
    CANCELLED = "cancelled"
    """Final: cancelled by the caller; reward None."""

    @property
    def final(self) -> bool:
        return self in _FINAL_STATES


_FINAL_STATES = frozenset({TaskState.DONE, TaskState.FAILED, TaskState.TIMED_OUT,
                           TaskState.CANCELLED})


# --------------------------------------------------------------------------- evaluation

@dataclass(frozen=True)
class EvalSample:
    """One answer to grade (a line of `trialbox eval --samples`): for a function task the
    completion is appended to the task's prompt; for a stdio task it is the whole program
    in `language`; for a repository task it is a unified diff, or `files` overlays the
    starting tree ({path: text, or None to delete})."""

    task_id: str
    completion: str | None = None
    """None only when `files` is given (a repository answer as an overlay)."""
    files: dict[str, str | None] | None = None
    language: Any = "python"
    """As the row gave it (checked against the task by the evaluator, which names what
    is wrong with a bad one in the sample's error row)."""

    @property
    def answer(self) -> str | dict[str, str | None]:
        """What the judge grades: the completion, or else the files overlay."""
        if self.completion is not None:
            return self.completion
        return self.files or {}

    @staticmethod
    def parse(row: object, where: str = "sample") -> EvalSample | SampleError:
        """A sample from its JSON object, or the error variant saying what is wrong with
        it (the row is then reported, never dropped)."""
        if not isinstance(row, dict):
            return SampleError(f"{where}: a sample must be a JSON object with task_id and "
                               "completion")
        task_id = row.get("task_id")
        if not isinstance(task_id, str):
            return SampleError(f"{where}: missing or non-string task_id")
        completion, files = row.get("completion"), row.get("files")
        if isinstance(files, dict) and "completion" not in row:
            return EvalSample(task_id, None, files, row.get("language", "python"))
        if not isinstance(completion, str):
            return SampleError(f"{where}: missing or non-string completion (repository "
                               "tasks may give \"files\" instead)", task_id)
        return EvalSample(task_id, completion, None, row.get("language", "python"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": self.task_id}
        if self.completion is not None:
            out["completion"] = self.completion
        if self.files is not None:
            out["files"] = self.files
        if self.language != "python":
            out["language"] = self.language
        return out


@dataclass(frozen=True)
class SampleError:
    """The error variant of a sample: a row that cannot be graded at all (not JSON, no
    task_id, no completion, unknown task...). It gets an error row saying why."""

    message: str
    task_id: str | None = None


Sample = EvalSample | SampleError
"""What a samples file holds, row by row: a sample to grade, or why a row is none."""


@dataclass(frozen=True)
class Repeat:
    """A repeated grading of the same sample (`trialbox eval --repeat`)."""

    outcome: Outcome
    reward: float | None


@dataclass(frozen=True)
class Scores:
    """A weighted reward's parts (`RewardSpec` not binary), shown beside the reward."""

    style_findings: tuple[str, ...] = ()
    """ruff's findings on the lines the candidate wrote."""
    style: float | None = None
    efficiency: float | None = None
    memory: float | None = None
    reference_peak_memory_bytes: int | None = None


_TEST_FIELDS = tuple(f.name for f in fields(TestResult))
"""A row's tests: every field of TestResult, all scalars — what asdict gives, without
its deep copy of each value (9 tests: ~100 -> ~11 us, on every judged attempt)."""


@dataclass(frozen=True)
class GradedRow:
    """One sample's graded row (`trialbox eval --out`, one per input row, in order): the
    first grading's evidence and reward, and whether repeated gradings agreed.

    A row that could not be graded (a `SampleError`, or a sample the evaluator refused)
    has outcome ERROR, reward None and no measurements (`graded` False). The JSON form
    (`to_dict`/`from_dict`) is the one rows files have always had."""

    task_id: str | None
    outcome: Outcome
    passed: bool = False
    reward: float | None = None
    """None: excluded from scoring (infrastructure, the task's own tests, bad input)."""
    message: str = ""
    flags: tuple[str, ...] = ()
    tests: tuple[TestResult, ...] = ()
    wall_ms: float = 0.0
    scores: Scores | None = None
    """The weighted reward's parts; None under the binary reward."""
    graded: bool = True
    """False for an error row: the fields below are then absent from its JSON."""
    candidate_cpu_ms: float = 0.0
    candidate_peak_memory_bytes: int = 0
    attempts: int = 1
    repeats: tuple[Repeat, ...] = ()
    deterministic: bool = True
    environment: str | None = None
    """`Runtime.id` the sample ran in; None when not recorded."""
    completion: str | None = None
    """The sample's completion as given (what `/review` shows a person to judge); None
    for a repository answer given as files, and in rows written before it was carried."""
    files: dict[str, str | None] | None = None
    """A repository answer given as a files overlay ({path: text, or None to delete}),
    as given; None otherwise."""

    @staticmethod
    def error(message: str, task_id: str | None = None) -> GradedRow:
        return GradedRow(task_id, Outcome.ERROR, message=message, graded=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": self.task_id, "passed": self.passed,
                               "reward": self.reward}
        if self.scores is not None:
            s = self.scores
            out.update(style_findings=list(s.style_findings), style=s.style,
                       efficiency=s.efficiency, memory=s.memory,
                       reference_peak_memory_bytes=s.reference_peak_memory_bytes)
        out.update(outcome=self.outcome.value, message=self.message, flags=list(self.flags),
                   tests=[{k: getattr(t, k) for k in _TEST_FIELDS} for t in self.tests],
                   wall_ms=self.wall_ms)
        if self.graded:
            out.update(candidate_cpu_ms=self.candidate_cpu_ms,
                       candidate_peak_memory_bytes=self.candidate_peak_memory_bytes,
                       attempts=self.attempts,
                       repeats=[{"outcome": r.outcome.value, "reward": r.reward}
                                for r in self.repeats],
                       deterministic=self.deterministic)
        if self.environment is not None:
            out["environment"] = self.environment
        if self.completion is not None:
            out["completion"] = self.completion
        if self.files is not None:
            out["files"] = dict(self.files)
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> GradedRow:
        """A row back from its JSON (any rows file `trialbox eval` wrote)."""
        scores = None
        if "style_findings" in d:
            scores = Scores(tuple(d["style_findings"]), d.get("style"), d.get("efficiency"),
                            d.get("memory"), d.get("reference_peak_memory_bytes"))
        return GradedRow(
            task_id=d.get("task_id"), outcome=Outcome(d["outcome"]),
            passed=bool(d.get("passed", False)), reward=d.get("reward"),
            message=d.get("message", ""), flags=tuple(d.get("flags", ())),
            tests=tuple(TestResult(**t) for t in d.get("tests", ())),
            wall_ms=d.get("wall_ms", 0.0), scores=scores,
            graded="attempts" in d, candidate_cpu_ms=d.get("candidate_cpu_ms", 0.0),
            candidate_peak_memory_bytes=d.get("candidate_peak_memory_bytes", 0),
            attempts=d.get("attempts", 1),
            repeats=tuple(Repeat(Outcome(r["outcome"]), r["reward"])
                          for r in d.get("repeats", ())),
            deterministic=d.get("deterministic", True), environment=d.get("environment"),
            completion=d.get("completion"), files=d.get("files"))


# --------------------------------------------------------------------------- training

@dataclass(frozen=True)
class StepSummary:
    """One training step's headline figures (the trainer's history, its plot)."""

    step: int
    reward: float
    """Mean reward over the step's graded episodes."""
    pass_rate: float
    pass_turn1: float
    """Share of graded episodes that passed at their first turn."""


@dataclass(frozen=True)
class TrainState:
    """The trainer's loop state: what a checkpoint saves (`state.json`) and `--resume`
    continues from. Replaced, never mutated, as the loop goes."""

    step: int = 0
    """Update steps done."""
    pass_before: float | None = None
    """Held-out pass@1 before training (None: no evaluation set)."""
    bad_in_a_row: int = 0
    """Consecutive steps skipped for a non-finite loss (stops at `max_bad_steps`)."""
    history: tuple[StepSummary, ...] = ()
    eval_before: dict[str, Any] | None = None
    """The evaluation record before training (`evaluate_pass1`), as logged."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "pass_before": self.pass_before,
                               "bad_in_a_row": self.bad_in_a_row,
                               "history": [asdict(h) for h in self.history]}
        if self.eval_before is not None:
            out["eval_before"] = self.eval_before
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TrainState:
        """From a checkpoint's `state.json` (any trialbox version's)."""
        return TrainState(step=int(d["step"]), pass_before=d.get("pass_before"),
                          bad_in_a_row=int(d.get("bad_in_a_row", 0)),
                          history=tuple(StepSummary(h["step"], h["reward"], h["pass_rate"],
                                                    h["pass_turn1"])
                                        for h in d.get("history", ())),
                          eval_before=d.get("eval_before"))
