"""Notifications on a LISTEN connection, heard when they arrive and at no cost between.

Invariant: a listening connection costs nothing while nothing arrives. psycopg's
`notifies()` wakes every 0.1 s to look for a cancel (a timer, a reader added and removed:
about 2 ms of CPU a second for each listener, measured on an idle worker); `Notifications`
waits on the socket alone. A notification that arrives while the connection runs a query
(the LISTEN itself, a re-check after it) is caught by a handler registered first, so none
is lost between the two. A connection that dies makes its socket readable, and reading it
raises: the caller's reconnect takes over.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from psycopg import AsyncConnection, Notify

__all__ = ["Notifications"]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Notifications:
    """The notifications of `conn`, in order (`async for note in Notifications(conn)`).
    Make it before the connection's LISTEN, so what arrives during a query is kept."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn
        self._heard: deque[Notify] = deque()
        conn.add_notify_handler(self._heard.append)

    async def __aiter__(self) -> AsyncIterator[Notify]:
        pgconn = self._conn.pgconn
        loop = asyncio.get_running_loop()
        while True:
            while self._heard:
                yield self._heard.popleft()
            readable: asyncio.Future[None] = loop.create_future()
            fd = pgconn.socket
            loop.add_reader(fd, _resolve, readable)
            try:
                await readable
            finally:
                loop.remove_reader(fd)
            pgconn.consume_input()  # raises OperationalError once the connection is gone
            while (note := pgconn.notifies()) is not None and pgconn.notify_handler:
                pgconn.notify_handler(note)  # psycopg's: decoded, to the handler above
