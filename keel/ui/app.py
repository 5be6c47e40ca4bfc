"""The web UI: sessions, a session's record and context, its checkpoints, the vault.

A small server-rendered Starlette app. It reads only through what the CLI reads through:
the session's queries via `keel.client`, the record and checkpoints via `keel.record`, the
event stream via `keel.events`, the vault via `activities.vault`; approvals go through
`keel.ui.approvals`. It holds no session logic and writes nothing but a person's decision
on an approval.

Invariants:
- Every page is bounded: the record is shown a page at a time (`page_size` rows, picked by
  seq on the record's key), whatever the record's length.
- Templates autoescape: text with markup in it is shown as text, never rendered.
- `keel.ui.security.Guard` wraps the app: Host check on loopback, the access token when one
  is set; every POST carries the process's CSRF token (form field and SameSite cookie)
  and a same-origin Origin (or Referer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from activities.db import get_pool
from keel.client import KeelClient, KeelError, SessionHandle
from keel.record import (
    CheckpointEntry,
    known_sessions,
    read_checkpoints,
    read_record_async,
    record_extent,
)
from keel.ui import approvals
from keel.ui.security import CSRF_COOKIE, Guard, csrf_ok
from keel.ui.views import Gauge, SessionRow, attr, conversation, mind_diff
from schemas.checkpoint.mind import MindDocument
from schemas.config import KeelSettings
from schemas.events import TextDelta
from schemas.session import SessionPhase, SessionStatus

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
STATUS_TIMEOUT_S = 3.0
LIVE_RECORD_POLL_S = 0.5
LIVE_STATUS_EVERY_S = 2.0
LIVE_PING_S = 15.0
CATCH_UP_S = 5.0  # text deltas older than this when the page connects are not relayed


@dataclass
class UiContext:
    """What the app reads from, fixed when it starts."""

    keel: KeelClient
    database_url: str
    settings: KeelSettings
    temporal_ui: str | None = None  # the Temporal Web UI's base URL, for workflow links
    token: str | None = None  # the access token; required off loopback
    allowed_hosts: set[str] | None = None  # Host headers accepted (None: any)
    page_size: int = 200
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def workflow_url(self, session_id: str) -> str | None:
        if not self.temporal_ui:
            return None
        ns = self.settings.temporal_namespace
        return f"{self.temporal_ui.rstrip('/')}/namespaces/{ns}/workflows/{session_id}"


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["n"] = lambda v: f"{int(v or 0):,}"
    env.filters["when"] = lambda v: (v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                                     if isinstance(v, datetime) else "—")
    env.globals["attr"] = attr
    env.filters["pretty"] = lambda v: (json.dumps(v, indent=1, ensure_ascii=False)
                                       if isinstance(v, dict | list) else str(v))
    return env


async def _status(handle: SessionHandle) -> SessionStatus | None:
    try:
        return await asyncio.wait_for(handle.status(), STATUS_TIMEOUT_S)
    except Exception as err:  # not found, no worker, closed: the page says "unknown"
        log.debug("status of %s: %s", handle.session_id, err)
        return None


async def _texts(handle: SessionHandle) -> dict[str, str]:
    async def one(name: str) -> str:
        try:
            text: str = await asyncio.wait_for(getattr(handle, name)(), STATUS_TIMEOUT_S)
            return text
        except Exception:
            return ""
    mind, memo, now = await asyncio.gather(one("mind"), one("memo"), one("now"))
    return {"mind": mind, "memo": memo, "now": now}


def create_app(ctx: UiContext) -> ASGIApp:
    env = _env()

    def page(request: Request, name: str, status_code: int = 200, **values: Any
             ) -> HTMLResponse:
        html = env.get_template(name).render(request=request, ctx=ctx, csrf=ctx.csrf,
                                             **values)
        response = HTMLResponse(html, status_code=status_code)
        response.set_cookie(CSRF_COOKIE, ctx.csrf, httponly=True, samesite="strict")
        return response

    async def pool() -> Any:
        return await get_pool(ctx.database_url)

    async def session_known(session_id: str) -> bool:
        async with (await pool()).connection() as conn:
            cur = await conn.execute("SELECT 1 FROM sessions WHERE session_id = %s",
                                     (session_id,))
            return await cur.fetchone() is not None

    async def not_found(request: Request, session_id: str) -> HTMLResponse:
        return page(request, "error.html", status_code=404, title="No such session",
                    message=f"There is no session {session_id!r} in the record.")

    # ----- sessions ----------------------------------------------------------------------

    async def sessions(request: Request) -> HTMLResponse:
        phase = request.query_params.get("phase") or ""
        async with (await pool()).connection() as conn:
            recorded = {r[0]: r for r in await known_sessions(conn)}
        listed: dict[str, Any] = {}
        lister = getattr(ctx.keel, "list_sessions", None)
        if callable(lister):  # issue 8's listing from Temporal visibility, where it exists
            try:
                listed = {str(attr(x, "session_id")): x for x in await lister()}
            except Exception as err:  # visibility unavailable: status queries for all
                log.warning("list_sessions failed, asking each session: %s", err)
        # Sessions visibility does not list are asked for their status, one query each.
        asked = [sid for sid in recorded if sid not in listed]
        statuses = dict(zip(asked, await asyncio.gather(
            *(_status(ctx.keel.session(sid)) for sid in asked)), strict=True))
        items: list[SessionRow] = []
        for sid, summary in listed.items():
            items.append(SessionRow.from_summary(summary, ctx.workflow_url(sid)))
        for sid, (_, created, last_at, checkpoints) in recorded.items():
            if sid not in listed:
                items.append(SessionRow.from_status(sid, statuses[sid], last_at or created,
                                                    checkpoints, ctx.workflow_url(sid)))
        phases = sorted({p.value for p in SessionPhase} | {i.phase for i in items})
        shown = [i for i in items if not phase or i.phase == phase]
        return page(request, "sessions.html", title="Sessions", items=shown, phase=phase,
                    phases=phases)

    # ----- one session -------------------------------------------------------------------

    async def record_page(session_id: str, from_seq: int | None, user_only: bool
                          ) -> dict[str, Any]:
        size = ctx.page_size
        async with (await pool()).connection() as conn:
            count, last_seq = await record_extent(conn, session_id)
            start = from_seq if from_seq is not None else (
                1 if user_only else max(1, last_seq - size + 1))
            rows = await read_record_async(conn, session_id, from_seq=start,
                                           user_only=user_only, limit=size)
        shown_to = rows[-1].seq if rows else start - 1
        return {"messages": conversation(rows), "count": count, "last_seq": last_seq,
                "from_seq": start, "shown_to": shown_to, "size": size,
                "at_end": shown_to >= last_seq, "user_only": user_only,
                "earlier": max(1, start - size) if start > 1 and not user_only else None,
                "later": shown_to + 1 if shown_to < last_seq else None}

    async def session_page(request: Request) -> HTMLResponse:
        session_id = request.path_params["session_id"]
        handle = ctx.keel.session(session_id)
        status, known = await asyncio.gather(_status(handle), session_known(session_id))
        if status is None and not known:
            return await not_found(request, session_id)
        q = request.query_params
        try:
            from_seq = int(q["from"]) if q.get("from") else None
        except ValueError:
            from_seq = None
        record = await record_page(session_id, from_seq, q.get("user") == "1")
        async with (await pool()).connection() as conn:
            checkpoints = await read_checkpoints(conn, session_id, texts=False)
        gauge = Gauge(status.context_tokens, status.checkpoint_threshold,
                      status.context_window) if status else None
        waiting = await approvals.pending(handle)
        return page(request, "session.html", title=session_id, session_id=session_id,
                    status=status, gauge=gauge, record=record, checkpoints=checkpoints,
                    recaps={c.record_seq: c.number for c in checkpoints},
                    pending=waiting, approvals_available=approvals.available(handle),
                    temporal=ctx.workflow_url(session_id))

    async def approvals_fragment(request: Request) -> HTMLResponse:
        session_id = request.path_params["session_id"]
        handle = ctx.keel.session(session_id)
        return page(request, "_approvals.html", session_id=session_id,
                    pending=await approvals.pending(handle),
                    approvals_available=approvals.available(handle))

    async def decide(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        call_id = request.path_params["call_id"]
        form = await request.form()
        if not csrf_ok(request, ctx.csrf, str(form.get("csrf", ""))):
            return HTMLResponse("cross-site request refused", status_code=403)
        decision = str(form.get("decision", ""))
        if decision not in ("approve", "deny"):
            return HTMLResponse("decision must be approve or deny", status_code=400)
        try:
            await approvals.decide(ctx.keel.session(session_id), call_id,
                                   decision == "approve", str(form.get("note", "")),
                                   str(form.get("input_digest", "")) or None)
        except approvals.ApprovalsUnavailableError as err:
            return HTMLResponse(str(err), status_code=501)
        except KeelError as err:  # not pending any more, the session stopped, ...
            return page(request, "error.html", status_code=409, title="Not decided",
                        message=str(err))
        return RedirectResponse(f"/sessions/{session_id}", status_code=303)

    # ----- checkpoints -------------------------------------------------------------------

    async def checkpoints_of(session_id: str) -> list[CheckpointEntry]:
        async with (await pool()).connection() as conn:
            return await read_checkpoints(conn, session_id)

    async def timeline(request: Request) -> HTMLResponse:
        session_id = request.path_params["session_id"]
        found = await checkpoints_of(session_id)
        if not found and not await session_known(session_id):
            return await not_found(request, session_id)
        return page(request, "checkpoints.html", title=f"{session_id}: checkpoints",
                    session_id=session_id, checkpoints=found)

    async def checkpoint_page(request: Request) -> HTMLResponse:
        session_id = request.path_params["session_id"]
        number = request.path_params["number"]
        found = await checkpoints_of(session_id)
        if not 1 <= number <= len(found):
            if not found and not await session_known(session_id):
                return await not_found(request, session_id)
            return page(request, "error.html", status_code=404, title="No such checkpoint",
                        message=f"{session_id} has {len(found)} checkpoint(s); there is no "
                                f"checkpoint {number}.")
        current = found[number - 1]
        previous = found[number - 2] if number > 1 else None
        diff = mind_diff(previous.mind_text if previous else MindDocument.template().text,
                         current.mind_text)
        counts = {op: sum(1 for d in diff if d.op == op) for op in ("added", "removed",
                                                                   "status")}
        return page(request, "checkpoint.html", title=f"{session_id}: checkpoint {number}",
                    session_id=session_id, cp=current, previous=previous, diff=diff,
                    counts=counts,
                    total=len(found), page_size=ctx.page_size)

    # ----- live --------------------------------------------------------------------------

    async def live(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        q = request.query_params
        after_seq = int(q.get("after_seq") or 0)
        after_event = int(q.get("after_event") or 0)
        follow_record = q.get("record", "1") == "1"
        return StreamingResponse(
            _live_stream(request, session_id, after_seq, after_event, follow_record),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def _live_stream(request: Request, session_id: str, after_seq: int,
                           after_event: int, follow_record: bool) -> AsyncIterator[str]:
        out: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=1_000)
        handle = ctx.keel.session(session_id)

        async def record_rows() -> None:
            last = after_seq
            while True:
                async with (await pool()).connection() as conn:
                    rows = await read_record_async(conn, session_id, from_seq=last + 1,
                                                   limit=100)
                if rows:
                    last = rows[-1].seq
                    html = env.get_template("_messages.html").render(
                        messages=conversation(rows), session_id=session_id)
                    await out.put(("record", {"html": html, "last_seq": last}))
                    continue
                await asyncio.sleep(LIVE_RECORD_POLL_S)

        async def status_updates() -> None:
            while True:
                status = await _status(handle)
                if status is not None:
                    await out.put(("status", status.model_dump(mode="json")))
                await asyncio.sleep(LIVE_STATUS_EVERY_S)

        async def events() -> None:
            from keel.events import Transport, session_events

            # Read by query: an observer that costs the session nothing (keel.events).
            # Catching up on an old stream, old text deltas are skipped: the record has
            # those replies whole.
            connected = datetime.now(UTC)
            try:
                async for offset, event in session_events(
                        ctx.keel.client, session_id, after_event, stop_at_end=False,
                        transport=Transport.QUERY):
                    if (isinstance(event, TextDelta)
                            and (connected - event.at).total_seconds() > CATCH_UP_S):
                        continue
                    await out.put(("event", {"offset": offset,
                                             **event.model_dump(mode="json")}))
            except Exception as err:  # a session without the stream: the record still flows
                await out.put(("stream", {"available": False, "reason": str(err)[:300]}))

        tasks = [asyncio.create_task(t()) for t in
                 ([record_rows] if follow_record else []) + [status_updates, events]]
        try:
            yield ": connected\n\n"
            last_ping = time.monotonic()
            while True:
                try:
                    name, data = await asyncio.wait_for(out.get(), 1.0)
                except TimeoutError:
                    if await request.is_disconnected():
                        return
                    if time.monotonic() - last_ping > LIVE_PING_S:
                        last_ping = time.monotonic()
                        yield ": ping\n\n"
                    continue
                yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
        finally:
            for t in tasks:
                t.cancel()

    # ----- the vault ---------------------------------------------------------------------

    async def vault_page(request: Request) -> HTMLResponse:
        from keel.ui.vault import hit_link, vault_view

        query = (request.query_params.get("q") or "").strip()
        view = await vault_view(ctx.settings, await pool() if query else None, query)
        return page(request, "vault.html", title="Vault", view=view, query=query,
                    hit_link=hit_link)

    async def home(request: Request) -> Response:
        return RedirectResponse("/sessions", status_code=307)

    routes = [
        Route("/", home),
        Route("/sessions", sessions),
        Route("/sessions/{session_id}", session_page),
        Route("/sessions/{session_id}/approvals", approvals_fragment),
        Route("/sessions/{session_id}/approvals/{call_id}", decide, methods=["POST"]),
        Route("/sessions/{session_id}/checkpoints", timeline),
        Route("/sessions/{session_id}/checkpoints/{number:int}", checkpoint_page),
        Route("/sessions/{session_id}/live", live),
        Route("/vault", vault_page),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    return Guard(app, ctx)
