"""`Notifications`: a LISTEN connection's notifications as they arrive, those that came
during a query included, and an error (not a hang) when the connection is gone."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from activities.listen import Notifications


async def _notify(url: str, *payloads: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
        for payload in payloads:
            await other.execute("SELECT pg_notify('keel_test', %s)", (payload,))


async def test_notifications_arrive_in_order_those_during_a_query_too(database_url) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        heard = Notifications(conn)
        await conn.execute("LISTEN keel_test")
        await _notify(database_url, "before-a-query")
        await conn.execute("SELECT 1")  # the notification is read with this query's result
        got: list[str] = []

        async def listen() -> None:
            async for note in heard:
                got.append(note.payload)
                if len(got) == 3:
                    return

        listener = asyncio.create_task(listen())
        await asyncio.sleep(0.05)
        assert not listener.done()  # waiting, nothing more has come
        await _notify(database_url, "second", "third")
        await asyncio.wait_for(listener, 5)
        assert got == ["before-a-query", "second", "third"]
        await _notify(database_url, "fourth")
        note = await asyncio.wait_for(anext(aiter(heard)), 5)
        assert (note.channel, note.payload) == ("keel_test", "fourth")


async def test_a_lost_connection_ends_the_wait_with_an_error(database_url):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        heard = Notifications(conn)
        await conn.execute("LISTEN keel_test")
        pid = conn.info.backend_pid

        async def listen() -> None:
            async for _ in heard:
                pass

        listener = asyncio.create_task(listen())
        await asyncio.sleep(0.05)
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(listener, 5)
