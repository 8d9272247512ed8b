"""Tiered priority queues with aging and a bound.

Tier 0 is the most urgent. Within a tier, first come first served. A task's *effective*
tier improves by one for every `aging_s` seconds it has waited, so low-priority work
cannot starve however much urgent work keeps arriving. `pop()` looks at the head of each
tier only (heads are the oldest, so the most aged): O(tiers), not O(queued).

The bound applies to new submissions (`push(..., force=False)`): past `max_queued`
waiting tasks, `QueueFull` tells the caller to slow down. Tasks already accepted (a
preempted task, a retry) are always taken back (`force=True`): refusing them would lose
them.
"""

from __future__ import annotations

from collections import deque

from trialbox.errors import UsageError
from trialbox.schedule.lifecycle import TaskRecord


class QueueFull(UsageError):
    """Backpressure: the scheduler holds as many waiting tasks as it was configured to.
    Submit later (when some finish) or raise `SchedulerConfig.max_queued`."""


class TieredQueue:
    def __init__(self, tiers: int, aging_s: float, max_queued: int):
        if tiers < 1:
            raise UsageError(f"tiers must be at least 1, got {tiers}")
        if not aging_s > 0:
            raise UsageError(f"aging_s must be positive, got {aging_s}")
        self.tiers = tiers
        self.aging_s = aging_s
        self.max_queued = max_queued
        self._q: list[deque[TaskRecord]] = [deque() for _ in range(tiers)]
        self._len = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._len

    def room(self) -> int:
        return max(0, self.max_queued - self._len)

    def check_room(self, n: int) -> None:
        if n > self.room():
            raise QueueFull(f"the queue holds {self._len} waiting tasks (max_queued="
                            f"{self.max_queued}); {n} more do not fit. Submit fewer at a "
                            "time, wait for tasks to finish, or raise max_queued")

    def push(self, rec: TaskRecord, *, front: bool = False, force: bool = False) -> None:
        """Queue a task in state QUEUED. `front`: ahead of its tier (a preempted task
        resumes before newcomers of its tier)."""
        if not force:
            self.check_room(1)
        if rec.priority < 0 or rec.priority >= self.tiers:
            raise UsageError(f"task {rec.task_id!r}: priority {rec.priority} is outside "
                             f"0..{self.tiers - 1} (0 is the most urgent)")
        if not rec.seq:
            self._seq += 1
            rec.seq = self._seq
        if rec.queued:
            raise UsageError(f"task {rec.task_id!r} is already queued")
        if front:
            self._q[rec.priority].appendleft(rec)
        else:
            self._q[rec.priority].append(rec)
        rec.queued = True
        self._len += 1

    def discard(self, rec: TaskRecord) -> None:
        """Forget a queued task that is leaving QUEUED (cancelled); a no-op for a task not
        in the queue. Its entry is dropped lazily when it reaches the head of its tier."""
        if rec.queued:
            rec.queued = False
            self._len -= 1

    def _head(self, tier: int) -> TaskRecord | None:
        q = self._q[tier]
        while q and not q[0].queued:
            q.popleft()  # discarded (cancelled) entry, already uncounted
        return q[0] if q else None

    def effective(self, rec: TaskRecord, now: float) -> int:
        return max(0, rec.priority - int((now - rec.queued_at) / self.aging_s))

    def best(self, now: float) -> TaskRecord | None:
        """The task `pop()` would return, without removing it."""
        best: TaskRecord | None = None
        key = (self.tiers, 0)
        for tier in range(self.tiers):
            head = self._head(tier)
            if head is None:
                continue
            k = (self.effective(head, now), head.seq if tier else 0)
            if k < key:
                best, key = head, k
            if key[0] == 0 and tier == 0:
                break  # nothing beats the head of tier 0
        return best

    def pop(self, now: float) -> TaskRecord | None:
        rec = self.best(now)
        if rec is not None:
            self._q[rec.priority].popleft()
            rec.queued = False
            self._len -= 1
        return rec

    def waiting_at_or_above(self, tier: int) -> int:
        """Waiting tasks whose base tier is `tier` or more urgent (approximate: counts
        entries, which may include discarded ones)."""
        return sum(len(q) for q in self._q[:tier + 1])
