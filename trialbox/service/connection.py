"""The HTTP connection: uvicorn's h11 protocol with a deadline on a request's headers.

uvicorn bounds how long a kept-alive connection may idle between requests, but not how
long a client may take to *send* one: a connection that opens and trickles its headers
a byte at a time (slowloris) was held for as long as the client liked. Here a deadline
of `read_timeout_s` starts when a connection opens, and again when the first bytes of a
next request arrive; if no complete request head has arrived by then, the connection is
closed. (A stalled body is the Guard's: 408, guard.py.)

    uvicorn.Config(app, http=header_deadline(15.0))
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadline(H11Protocol):
    """`H11Protocol` that closes a connection whose request head is not complete within
    `read_timeout_s` (a class attribute: uvicorn builds protocols from a class)."""

    read_timeout_s = 15.0
    _timer: asyncio.TimerHandle | None = None
    _armed_for: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)
        if self._timer is not None and self.cycle is not self._armed_for:
            self._disarm()  # a request's head is in: its handler runs

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._armed_for = self.cycle
        self._timer = self.loop.call_later(self.read_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.cycle is self._armed_for and not self.transport.is_closing():
            self.transport.close()


def header_deadline(read_timeout_s: float) -> type[HeaderDeadline]:
    """The protocol class for a server whose clients get `read_timeout_s` per head."""
    return type("HeaderDeadline", (HeaderDeadline,), {"read_timeout_s": read_timeout_s})
