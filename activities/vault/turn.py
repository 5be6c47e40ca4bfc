"""The activities a session calls each turn: recall, the memory flush, the transcript.

Each takes references (a session id, sequence numbers), loads what it needs from the
record, and returns a small result. The contracts travel in Temporal histories: add
fields only as optional with defaults.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from pydantic import BaseModel, Field
from temporalio import activity

from activities.vault.rollup import apply_facts_of, ask_model, store_plan, stored_plan
from activities.vault.search import (
    embed_pending,
    index_document,
    load_embedder,
    search,
    touch_documents,
)
from activities.vault.store import MemoryContext, atomic_write, daily_doc, read_text
from schemas.tokens import count_tokens
from schemas.vault.recall import fence_memory
from schemas.vault.rollup import (
    RollupKind,
    chunk_texts,
    render_entries,
    split_transcript,
    transcript_entry,
)
from schemas.vault.schema import DAILY_DIR, SearchMode


class RecallInput(BaseModel):
    session_id: str
    query: str
    k: int = 5


class RecallResult(BaseModel):
    block: str  # the fenced text; "" when nothing was found
    hits: int
    sources: list[str] = Field(default_factory=list)  # the hits' vault paths, for events


class FlushInput(BaseModel):
    session_id: str
    from_seq: int
    to_seq: int


class FlushResult(BaseModel):
    added: int = 0
    superseded: int = 0
    noop: int = 0
    rejected: int = 0


class TranscriptInput(BaseModel):
    session_id: str
    seq: int


class TranscriptResult(BaseModel):
    path: str  # vault-relative daily file; "" when the message is not transcribed
    appended: bool  # False on a retry that found the entry already there



# Recall never surfaces CORE.md (it is in the system prompt already) or MOC.md.
RECALL_KINDS = ["card", "summary", "daily", "note"]
# What the daily transcript keeps: the conversation, not tool output or Keel's own notices.
TRANSCRIBED = {"user": "user", "harness": "harness", "assistant": "assistant"}
MAX_RECALL_K = 20
RECALL_EMBED_LIMIT = 64


class MemoryActivities:
    def __init__(self, ctx: MemoryContext) -> None:
        self.ctx = ctx
        self._embedder = (load_embedder(ctx.memory.embedder or "hashing")
                          if ctx.memory.search_mode == SearchMode.HYBRID else None)

    @activity.defn(name="recall_memory")
    async def recall_memory(self, inp: RecallInput) -> RecallResult:
        """The `<memory-context>` block for this turn's query ("" when nothing matches).

        The session's own messages are left out: its live window and checkpoint carry them.
        """
        if not inp.query.strip():
            return RecallResult(block="", hits=0)
        pool = await self.ctx.pool()
        vault = self.ctx.vault
        async with pool.connection() as conn:
            if vault.root.exists():
                await vault.refresh(conn)
            if self._embedder is not None:
                # New documents join the dense side as they come; the doctor catches up.
                await embed_pending(conn, self._embedder, limit=RECALL_EMBED_LIMIT)
            hits = await search(conn, inp.query, k=max(1, min(inp.k, MAX_RECALL_K)),
                                kinds=RECALL_KINDS, exclude_session=inp.session_id,
                                embedder=self._embedder)
            await touch_documents(conn, [h.path for h in hits])
        return RecallResult(block=fence_memory(hits), hits=len(hits),
                            sources=[h.path for h in hits])

    @activity.defn(name="flush_memory")
    async def flush_memory(self, inp: FlushInput) -> FlushResult:
        """Write the durable facts of seqs from_seq..to_seq to cards before they leave the
        window. A retry reuses the stored plan and skips applied ops."""
        plan_id = f"flush:{inp.session_id}:{inp.from_seq}-{inp.to_seq}"
        pool = await self.ctx.pool()
        vault = self.ctx.vault
        await asyncio.to_thread(vault.ensure)
        plan = await stored_plan(pool, plan_id)
        last_at: datetime | None = None
        if plan is None:
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT type, content_text, created_at FROM messages"
                    " WHERE session_id = %s AND seq BETWEEN %s AND %s"
                    " AND type = ANY(%s) ORDER BY seq",
                    (inp.session_id, inp.from_seq, inp.to_seq, list(TRANSCRIBED)))
                rows = await cur.fetchall()
            entries = [(TRANSCRIBED[t], at.astimezone(vault.tz()).strftime("%H:%M:%S"), text)
                       for t, text, at in rows if text.strip()]
            if not entries:
                return FlushResult()
            last_at = rows[-1][2]
            chunks = ["<messages>\n" + "\n".join(c) + "\n</messages>"
                      for c in chunk_texts(render_entries(entries),
                                           self.ctx.memory.rollup_chunk_tokens, count_tokens)]
            period = vault.local_date(last_at)
            made = await ask_model(self.ctx, RollupKind.FLUSH, period, chunks, "")
            plan = await store_plan(pool, plan_id, made)
        result = await apply_facts_of(self.ctx, plan_id, plan.facts, plan.period)
        return FlushResult(added=result.added, superseded=result.superseded,
                           noop=result.noop, rejected=result.rejected + len(plan.rejected))

    @activity.defn(name="append_transcript")
    async def append_transcript(self, inp: TranscriptInput) -> TranscriptResult:
        """Append one message, word for word, to daily/YYYY-MM-DD.md (server-local date).

        Idempotent: the entry carries a marker, and a retry that finds it appends nothing.
        The file is only ever appended to, so a person's edits and even bytes that are not
        valid UTF-8 stay exactly as they are.
        """
        pool = await self.ctx.pool()
        async with pool.connection() as conn:
            row = await (await conn.execute(
                "SELECT type, source_line, content_text, created_at FROM messages"
                " WHERE session_id = %s AND seq = %s", (inp.session_id, inp.seq))).fetchone()
        if row is None:
            raise ValueError(f"no message {inp.seq} in session {inp.session_id}")
        kind, source_line, text, created_at = row
        role = TRANSCRIBED.get(kind)
        if role is None or not text.strip():
            return TranscriptResult(path="", appended=False)
        if source_line and not text.startswith(source_line):
            text = f"{source_line}\n{text}" if kind == "harness" else f"{source_line} {text}"
        vault = self.ctx.vault
        await asyncio.to_thread(vault.ensure)
        local = created_at.astimezone(vault.tz())
        rel = f"{DAILY_DIR}/{local.date().isoformat()}.md"
        path = vault.path(rel)
        entry = transcript_entry(inp.session_id, inp.seq, local, role, text)
        async with vault.lock():
            if path.exists():
                present = {(sid, seq) for sid, seq, _ in split_transcript(read_text(path).text)}
                if (inp.session_id, inp.seq) in present:
                    return TranscriptResult(path=rel, appended=False)
                with path.open("ab") as f:
                    f.write(entry.encode("utf-8"))
            else:
                atomic_write(path, f"# {local.date().isoformat()}\n{entry}")
            async with pool.connection() as conn:
                await index_document(conn, daily_doc(rel, inp.session_id, inp.seq,
                                                     entry.strip()))
        return TranscriptResult(path=rel, appended=True)
