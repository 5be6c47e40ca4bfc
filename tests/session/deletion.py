"""What the session-deletion tests share with the web UI's and the scope erasure's: the
rows a session left behind in any table (`left_behind`), and a wait until Temporal no longer
has its workflow (`temporal_forgot`)."""

from __future__ import annotations

import asyncio
import time

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from tests.session.branching import db


def left_behind(database_url: str, session_id: str) -> dict[str, int]:
    """Every table with a session_id or a scope column (whatever a later migration adds),
    and how many of its rows name `session_id`; only the nonzero ones. Not the vault's
    index (`memory_*`): long memory is the scope's, and stays."""
    columns = db(database_url, "SELECT table_name, column_name FROM information_schema.columns"
                 " WHERE table_schema = 'public' AND column_name IN ('session_id', 'scope')"
                 " AND table_name NOT LIKE 'memory\\_%%'")
    counts = {f"{table}.{column}": db(database_url, f"SELECT count(*) FROM {table} WHERE "
                                      f"{column} = %s", session_id)[0][0]
              for table, column in columns}
    return {name: n for name, n in counts.items() if n}


async def temporal_forgot(client: Client, session_id: str, within_s: float = 15) -> None:
    """Temporal no longer has the workflow (deletion is carried out in the background)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            await client.get_workflow_handle(session_id).describe()
        except RPCError as err:
            assert err.status == RPCStatusCode.NOT_FOUND
            return
        assert time.monotonic() < deadline, f"{session_id} still in Temporal"
        await asyncio.sleep(0.2)
