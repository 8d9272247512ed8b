"""Running work for a request: through the admission queue, against its deadline.

    result = await guarded(state, request, lambda ticket: run_code(sb, code), stop=sb.stop)

`guarded` takes a slot — a scheduler task at the interactive priority (admission.py);
503 + Retry-After when none comes — runs the work with the slot's `Ticket` (its
`ctx.lease()` is how one-shot work gets its sandbox), and when the
request's deadline passes first it calls `stop` (which kills the sandbox run in flight,
so the work returns promptly), waits briefly for the work to finish, and raises
`DeadlineExpired` (504). Work that cannot be stopped that way is cancelled.

`placed_twice` is the rule for stateless work on a cluster node (`--backend ray`): a
one-shot run or a grading whose node is lost is placed once more, on another node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from trialbox.errors import InfraError, NodeLost
from trialbox.service.admission import Overloaded, Ticket
from trialbox.service.errors import DeadlineExpired
from trialbox.service.state import ServiceState

T = TypeVar("T")
log = logging.getLogger("trialbox.service")

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
        try:  # a stop that cannot reach the run (its node lost, or every slot of the
            # node busy) must not hold the answer back: the work is cancelled below
            await asyncio.wait_for(stop(), STOP_GRACE_S)
        except (InfraError, TimeoutError):
            pass
        done, _ = await asyncio.wait([task], timeout=STOP_GRACE_S)
    if not done:
        task.cancel()
        await asyncio.wait([task], timeout=STOP_GRACE_S)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: an error of stopped work is not worth a warning
    raise DeadlineExpired(f"the request's deadline passed before {what} finished; "
                          "it was stopped. Allow more time (X-Deadline-S, or the "
                          "server's --deadline-s) or run less")


async def placed_twice(state: ServiceState, what: str, attempt: Callable[[], Awaitable[T]],
                       forget: Callable[[], Awaitable[None]] | None = None) -> T:
    """`attempt()`, and once more if the cluster node it ran on was lost (`NodeLost`).

    Only for work that keeps no state between attempts (a one-shot run in a fresh
    session, a grading): its first placement's lease is fenced when the node is lost,
    so whatever that node still answers is discarded and the client gets exactly one
    result. `forget` runs after each loss (ends the lost session). Lost twice:
    `InfraError` (503 `infra`), never an outcome of the code. On one machine nothing
    raises `NodeLost` and this is one call of `attempt`."""
    try:
        return await attempt()
    except NodeLost as e:
        if forget is not None:
            await forget()
        state.counters.replaced += 1
        log.warning("%s: its cluster node was lost (%s); placed once more", what, e)
    try:
        return await attempt()
    except NodeLost as e:
        if forget is not None:
            await forget()
        raise InfraError(f"{what} was placed again after its cluster node was lost, and "
                         f"the second node was lost too ({e}); nothing of it counts. "
                         "Retry the request") from None
