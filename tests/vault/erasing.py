"""What the scope-erasure tests share with the web UI's: a session of a scope whose card
and words are in its memory (`remembered`, `found`), and the rows that name a scope in any
table (`scope_rows`)."""

from __future__ import annotations

import uuid

from keel.client import KeelClient, SessionHandle, session_config
from keel.record import search_memory
from tests.harness import until
from tests.session.branching import db
from tests.session.long_memory import transcribed


def scope_rows(database_url: str, scope: str) -> dict[str, int]:
    """Every table with a `scope` column (whatever a later migration adds), and how many
    of its rows name `scope`; only the nonzero ones. Not the workspace's tables, whose
    `scope` is a session's id."""
    tables = db(database_url, "SELECT table_name FROM information_schema.columns WHERE"
                " table_schema = 'public' AND column_name = 'scope'"
                " AND table_name NOT LIKE 'workspace\\_%%'")
    counts = {t: db(database_url, f"SELECT count(*) FROM {t} WHERE scope = %s", scope)[0][0]
              for (t,) in tables}
    return {t: n for t, n in counts.items() if n}


async def remembered(keel: KeelClient, scope: str, words: str) -> SessionHandle:
    """A session of `scope` that wrote a card and whose words are found in its memory."""
    session = await keel.start_session(
        f"{scope}-s-{uuid.uuid4().hex[:6]}",
        config=session_config(keel.settings, memory_scope=scope))
    await session.ask("remember Dana")  # a card; #1 to #4
    await session.ask(words)  # #5, #6
    await transcribed(keel.settings.memory.vault_dir_for(scope), session.session_id, 6)
    await until(lambda: found(keel, scope, words))
    return session


async def found(keel: KeelClient, scope: str, words: str) -> bool:
    hits = await search_memory(str(keel.settings.database_url), words, scope=scope, k=5)
    return any(words in h.snippet for h in hits)
