"""The record's tools as the model calls them (activities.tools: read_record, search_record)
over a real record: search finds the words as written (a % or _ is a character, not a
wildcard) or a file's name, and says a message's files beside it."""

from __future__ import annotations

import psycopg

from activities.record import NewRow, ensure_session, insert_row
from activities.tools import ToolContext, execute_tool
from activities.workspace import LocalStore
from schemas.messages import MessageType

SID = "record-tools-1"
FILE = {"name": "deal_v2.pdf", "path": "attachments/x/deal_v2.pdf",
        "media_type": "application/pdf", "size": 900, "sha256": "0" * 64, "pages": 2,
        "tokens": 6000, "data": "JVBERi0="}


async def test_search_takes_the_words_as_written_and_finds_files_by_name(database_url, tmp_path):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await ensure_session(conn, SID, "u")
        for seq, text, content in ((1, "the rate rose 100% today", None),
                                   (2, "the rate rose 100 points", None),
                                   (3, "here is the deal", {"attachments": [FILE]}),
                                   (4, "a_b and aXb", None)):
            await insert_row(conn, NewRow(session_id=SID, seq=seq, input_id=f"in-{seq}",
                                          type=MessageType.USER, text=text, turn=1,
                                          content=content))
        ctx = ToolContext(session_id=SID, store=LocalStore(tmp_path, tmp_path, 10**6, 10**7),
                          skills=[], conn=conn, upto_seq=10)

        async def search(query: str) -> str:
            return (await execute_tool(ctx, "search_record", {"query": query})).text

        assert await search("100%") == "#1 [user] the rate rose 100% today"
        assert await search("a_b") == "#4 [user] a_b and aXb"
        assert await search("v2.pdf") == "#3 [user] here is the deal [files: deal_v2.pdf]"
        read = (await execute_tool(ctx, "read_record", {"from_seq": 3, "limit": 1})).text
    assert read.splitlines() == ["#3 [user] here is the deal",
                                 "[attached: deal_v2.pdf (application/pdf, 2 pages, 900 bytes)]"]
