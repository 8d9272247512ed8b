"""The task lifecycle: the legal transitions in one table, and the in-memory task record.

    PENDING ─► QUEUED ─► GENERATING ⇄ EXECUTING
                 ▲          │   │         │
                 │          ▼   ▼         ▼
                 │        GRADING ──► DONE
                 │          │
       PREEMPTED ◄──────────┤ (GENERATING / EXECUTING only)
       RETRYING  ◄──────────┘ (an infrastructure failure; then QUEUED after a backoff)
    any non-final state ─► CANCELLED;  in-flight states ─► FAILED, TIMED_OUT

The journal (`trialbox.store.journal`) records every move *before* it takes effect; the
scheduler (`scheduler.py`) is the only code that moves a task. A move not in
`TRANSITIONS` raises `IllegalTransition`, naming both states.
"""

from __future__ import annotations

from trialbox.errors import UsageError
from trialbox.types import TaskState

S = TaskState

_IN_FLIGHT_EXITS = frozenset({S.PREEMPTED, S.RETRYING, S.FAILED, S.TIMED_OUT, S.CANCELLED})

TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    S.PENDING: frozenset({S.QUEUED, S.CANCELLED}),
    S.QUEUED: frozenset({S.GENERATING, S.CANCELLED}),
    S.GENERATING: frozenset({S.EXECUTING, S.GRADING}) | _IN_FLIGHT_EXITS,
    S.EXECUTING: frozenset({S.GENERATING, S.GRADING}) | _IN_FLIGHT_EXITS,
    # Grading is not preempted (it is nearly done and holds no slot-worthy compute of
    # the policy's); a crash or a judge infra failure sends it to RETRYING.
    S.GRADING: frozenset({S.DONE, S.RETRYING, S.FAILED, S.TIMED_OUT, S.CANCELLED}),
    S.RETRYING: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.CANCELLED}),
    S.DONE: frozenset(),
    S.FAILED: frozenset(),
    S.TIMED_OUT: frozenset(),
    S.CANCELLED: frozenset(),
}
"""state -> the states it may move to. The one place the lifecycle is defined."""

FINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
"""Nothing leaves these; a task reaches exactly one of them exactly once."""

IN_FLIGHT = frozenset({S.GENERATING, S.EXECUTING, S.GRADING})
"""States that hold a slot. A crash in one of them is an infrastructure failure of that
attempt: recovery moves the task to RETRYING (its turns kept) and queues it again."""

WAITING = frozenset({S.PENDING, S.QUEUED, S.RETRYING, S.PREEMPTED})
"""States that hold nothing; recovery queues them again as they are."""


class IllegalTransition(UsageError):
    """A move the lifecycle table does not allow (a bug in whoever asked for it)."""

    def __init__(self, task_id: str, old: TaskState, new: TaskState):
        allowed = ", ".join(sorted(s.name for s in TRANSITIONS[old])) or "nothing (final)"
        super().__init__(f"task {task_id!r}: illegal transition {old.name} -> {new.name}; "
                         f"from {old.name} the lifecycle allows: {allowed}")
        self.task_id, self.old, self.new = task_id, old, new


def check(task_id: str, old: TaskState, new: TaskState) -> None:
    """Raise IllegalTransition unless `old -> new` is in the table."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(task_id, old, new)


class TaskRecord:
    """What the scheduler keeps in memory per task. Small on purpose (slots, no dict):
    10,000 queued tasks must cost well under 5 KB each. The job's own data lives in the
    caller's `payload` object, shared, never copied."""

    __slots__ = ("task_id", "priority", "state", "attempt", "infra_failures",
                 "preemptions", "submitted_at", "queued_at", "ready_at", "payload",
                 "trace_id", "sandbox", "runtime", "quota", "turns", "handle", "stop",
                 "seq", "timeout", "deadline", "in_job", "started", "queued")

    def __init__(self, task_id: str, priority: int, payload: object, trace_id: str,
                 submitted_at: float, quota: object = None):
        self.task_id = task_id
        self.priority = priority
        """Base tier: 0 is the most urgent."""
        self.state = TaskState.PENDING
        self.attempt = 1
        self.infra_failures = 0
        self.preemptions = 0
        self.submitted_at = submitted_at
        self.queued_at = submitted_at
        """When it last entered QUEUED (aging counts from here)."""
        self.ready_at = submitted_at
        """When a slot it could take last became free: dispatch latency counts from here."""
        self.payload = payload
        self.trace_id = trace_id
        self.sandbox = ""
        self.runtime = ""
        self.quota = quota
        self.turns: int = 0
        """How many turns are journaled (kept across preemption, retries and crashes)."""
        self.handle: object = None
        """The asyncio.Task running its job while in flight."""
        self.stop: TaskState | None = None
        """Why its job is being cancelled: PREEMPTED or CANCELLED (None: not cancelled)."""
        self.seq = 0
        """Queue order stamp; a re-queued task keeps its first stamp (no starvation)."""
        self.timeout: object = None
        """The asyncio.Timeout bounding the current turn and the whole task."""
        self.deadline: float | None = None
        """When the current attempt must end (task timeout), monotonic seconds."""
        self.started = False
        """Its dispatched asyncio task has taken its first step."""
        self.queued = False
        """In the queue right now (a QUEUED task may still be waiting for its commit)."""
        self.in_job = False
        """From its dispatch until its job returns: the only time it may be preempted or
        cancelled by cancelling its asyncio task (after it, the scheduler is recording
        the attempt's outcome, which must not be interrupted)."""

    def move(self, new: TaskState) -> TaskState:
        """Check and apply `state -> new` in memory; returns the old state. The caller
        journals the move and awaits the commit before acting on it."""
        old = self.state
        check(self.task_id, old, new)
        self.state = new
        return old

    def __repr__(self) -> str:
        return (f"TaskRecord({self.task_id!r}, {self.state.name}, attempt={self.attempt}, "
                f"priority={self.priority})")
