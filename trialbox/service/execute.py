"""Running work for a request: through the admission queue, against its deadline.

    result = await guarded(state, request, lambda ticket: run_code(sb, code), stop=sb.stop)

`guarded` takes a slot — a scheduler task at the interactive priority (admission.py);
503 + Retry-After when none comes — runs the work with the slot's `Ticket` (its
`ctx.lease()` is how one-shot work gets its sandbox), and when the
request's deadline passes first it calls `stop` (which kills the sandbox run in flight,
so the work returns promptly), waits briefly for the work to finish, and raises
`DeadlineExpired` (504). Work that cannot be stopped that way is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from trialbox.service.admission import Overloaded, Ticket
from trialbox.service.errors import DeadlineExpired
from trialbox.service.state import ServiceState

T = TypeVar("T")

STOP_GRACE_S = 5.0
"""How long stopped work may take to wind down before it is cancelled."""


def deadline_of(request: Request) -> float:
    deadline = getattr(request.state, "deadline", None)
    if deadline is None:  # not behind Guard (a bare app in a unit test)
        return time.monotonic() + 3600.0
    return float(deadline)


async def guarded(state: ServiceState, request: Request,
                  work: Callable[[Ticket], Awaitable[T]],
                  stop: Callable[[], Awaitable[None]] | None = None,
                  what: str = "the run", kind: str = "run") -> T:
    deadline = deadline_of(request)
    try:
        async with state.admission.slot(timeout=deadline - time.monotonic(),
                                        kind=kind) as ticket:
            return await _until(state, deadline, lambda: work(ticket), stop, what)
    except Overloaded:
        if time.monotonic() >= deadline:
            state.counters.deadline_expired += 1
            raise DeadlineExpired("the request's deadline passed while it waited for a "
                                  "sandbox slot; nothing was run. Retry, or allow more "
                                  "time (X-Deadline-S)") from None
        state.counters.rejected["overload"] += 1
        raise


async def _until(state: ServiceState, deadline: float, work: Callable[[], Awaitable[T]],
                 stop: Callable[[], Awaitable[None]] | None, what: str) -> T:
    task: asyncio.Future[T] = asyncio.ensure_future(work())
    try:
        done, _ = await asyncio.wait([task], timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        return task.result()
    state.counters.deadline_expired += 1
    if stop is not None:
        await stop()
        done, _ = await asyncio.wait([task], timeout=STOP_GRACE_S)
    if not done:
        task.cancel()
        await asyncio.wait([task], timeout=STOP_GRACE_S)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: an error of stopped work is not worth a warning
    raise DeadlineExpired(f"the request's deadline passed before {what} finished; "
                          "it was stopped. Allow more time (X-Deadline-S, or the "
                          "server's --deadline-s) or run less")
