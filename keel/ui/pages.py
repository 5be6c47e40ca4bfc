"""The pages: the sessions list, one session (its status, approvals and record), its
checkpoints, one checkpoint's mind diff, and the vault.

Each page is a module-level Starlette endpoint reading the app's `UiContext`
(`keel.ui.context.ui`). It reads the session through `keel.client`, the record and the
checkpoints through `keel.record` (there is no SQL in the UI), the vault through
`keel.ui.vault`; it writes nothing but what a person asks on its pages (an approval's
decision, a fork or rewind, a stop, a budget, a deletion, asked once more).

Invariants:
- Every page is bounded: the record is shown a page at a time (`page_size` rows, picked by
  seq on the record's key), whatever the record's length.
- A session neither Temporal nor the record knows is a 404 page that says so; a session
  that does not answer its status query is still shown from the record.
- A decision is taken only from one of the UI's own pages (`keel.ui.security.csrf_ok`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData, QueryParams, UploadFile
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from keel.client import KeelError, NoBudgetRequestError, SessionHandle
from keel.handle import refuse_before_sending
from keel.record import (
    CheckpointEntry,
    known_sessions,
    read_checkpoints,
    read_file_of,
    read_record_async,
    record_extent,
    session_exists,
    session_origin,
    session_scope,
)
from keel.ui import approvals
from keel.ui.approvals import DECIDED_BY
from keel.ui.context import UiContext, render, ui
from keel.ui.security import csrf_ok
from keel.ui.vault import hit_link, vault_view
from keel.ui.views import Gauge, SessionRow, conversation, mind_diff
from keel.uploads import UploadRefused, read_within
from keel.uploads import checked as uploads_checked
from keel.uploads import put as put_uploads
from schemas.attachments import MAX_MESSAGE_ATTACHMENTS
from schemas.checkpoint.mind import MindDocument
from schemas.session import SessionPhase, SessionStatus, SessionSummary
from schemas.vault.erase import erased_text
from schemas.vault.forget import forgotten_text
from schemas.vault.scope import DEFAULT_SCOPE, is_scope, unknown_scope_text

__all__ = ["approvals_fragment", "branch", "checkpoint_page", "decide", "erase", "erase_page",
           "home", "session_page", "session_status", "sessions", "timeline", "vault_page"]

log = logging.getLogger(__name__)
STATUS_TIMEOUT_S = 3.0


async def session_status(handle: SessionHandle) -> SessionStatus | None:
    """The session's status, or None when it does not answer in time."""
    try:
        return await asyncio.wait_for(handle.status(), STATUS_TIMEOUT_S)
    except Exception as err:  # not found, no worker, closed: the page says "unknown"
        log.debug("status of %s: %s", handle.session_id, err)
        return None


async def session_known(ctx: UiContext, session_id: str) -> bool:
    async with ctx.connection() as conn:
        return await session_exists(conn, session_id)


def no_such_session(request: Request, session_id: str) -> HTMLResponse:
    return render(request, "error.html", status_code=404, title="No such session",
                  message=f"There is no session {session_id!r} in the record.")


# ----- sessions ---------------------------------------------------------------------------

async def _listed(ctx: UiContext) -> dict[str, SessionSummary]:
    """The sessions Temporal visibility lists ({} when it cannot answer)."""
    try:
        return {x.session_id: x for x in await ctx.keel.list_sessions()}
    except Exception as err:  # visibility unavailable: status queries for all
        log.warning("list_sessions failed, asking each session: %s", err)
        return {}


async def sessions(request: Request) -> HTMLResponse:
    ctx = ui(request)
    phase = request.query_params.get("phase") or ""
    async with ctx.connection() as conn:
        recorded = {r[0]: r for r in await known_sessions(conn)}
    listed = await _listed(ctx)
    # Sessions visibility does not list are asked for their status, one query each.
    asked = [sid for sid in recorded if sid not in listed]
    statuses = dict(zip(asked, await asyncio.gather(
        *(session_status(ctx.keel.session(sid)) for sid in asked)), strict=True))
    items = [SessionRow.from_summary(summary, ctx.workflow_url(sid))
             for sid, summary in listed.items()]
    for sid, (_, created, last_at, checkpoints) in recorded.items():
        if sid not in listed:
            items.append(SessionRow.from_status(sid, statuses[sid], last_at or created,
                                                checkpoints, ctx.workflow_url(sid)))
    phases = sorted({p.value for p in SessionPhase} | {i.phase for i in items})
    shown = [i for i in items if not phase or i.phase == phase]
    return render(request, "sessions.html", title="Sessions", items=shown, phase=phase,
                  phases=phases)


# ----- one session ------------------------------------------------------------------------

def _from_seq(q: QueryParams) -> int | None:
    try:
        return int(q["from"]) if q.get("from") else None
    except ValueError:
        return None


async def _record_page(ctx: UiContext, session_id: str, from_seq: int | None,
                       user_only: bool) -> dict[str, Any]:
    """One page of the record (the latest, unless `from_seq` says where) and its pager."""
    size = ctx.page_size
    async with ctx.connection() as conn:
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


async def _checkpoints(ctx: UiContext, session_id: str, *, texts: bool = True
                       ) -> list[CheckpointEntry]:
    async with ctx.connection() as conn:
        return await read_checkpoints(conn, session_id, texts=texts)


async def session_page(request: Request) -> HTMLResponse:
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    handle = ctx.keel.session(session_id)
    status, known = await asyncio.gather(session_status(handle), session_known(ctx, session_id))
    if status is None and not known:
        return no_such_session(request, session_id)
    q = request.query_params
    record = await _record_page(ctx, session_id, _from_seq(q), q.get("user") == "1")
    checkpoints = await _checkpoints(ctx, session_id, texts=False)
    gauge = Gauge(status.context_tokens, status.checkpoint_threshold,
                  status.context_window) if status else None
    waiting = await approvals.pending(handle)
    async with ctx.connection() as conn:
        origin = await session_origin(conn, session_id)
        scope = await session_scope(conn, session_id)
    return render(request, "session.html", title=session_id, session_id=session_id,
                  status=status, gauge=gauge, record=record, checkpoints=checkpoints,
                  origin=origin, scope=scope,
                  recaps={c.record_seq: c.number for c in checkpoints},
                  pending=waiting, temporal=ctx.workflow_url(session_id))


async def _own_form(request: Request) -> FormData | None:
    """The posted form when one of the UI's own pages sent it (its CSRF token, its
    origin: `csrf_ok`), else None and the caller answers `_refused()`. A form larger than
    a message's files could be is refused by its length before it is read (a file part
    is spooled to disk as it comes)."""
    most = MAX_MESSAGE_ATTACHMENTS * ui(request).settings.max_file_bytes + FORM_ROOM_BYTES
    length = request.headers.get("content-length")
    if length is None or not length.isdecimal() or int(length) > most:
        raise FormTooLarge(f"a form of at most {most} bytes, its length given, is taken; "
                           f"this one is {length or 'of no given length'}")
    form = await request.form()
    return form if csrf_ok(request, ui(request).csrf, str(form.get("csrf", ""))) else None


# Beside a message's files, what its form may hold: the text (a message's payload limit)
# and the form's own parts.
FORM_ROOM_BYTES = 2 * 1024 * 1024


class FormTooLarge(ValueError):
    """A posted form larger than any the pages send."""


def _refused() -> HTMLResponse:
    return HTMLResponse("cross-site request refused", status_code=403)


async def approvals_fragment(request: Request) -> HTMLResponse:
    session_id = request.path_params["session_id"]
    handle = ui(request).keel.session(session_id)
    return render(request, "_approvals.html", session_id=session_id,
                  pending=await approvals.pending(handle))


async def decide(request: Request) -> Response:
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    call_id = request.path_params["call_id"]
    form = await _own_form(request)
    if form is None:
        return _refused()
    decision = str(form.get("decision", ""))
    if decision not in ("approve", "deny"):
        return HTMLResponse("decision must be approve or deny", status_code=400)
    try:
        await approvals.decide(ctx.keel.session(session_id), call_id,
                               decision == "approve", str(form.get("note", "")),
                               str(form.get("input_digest", "")) or None)
    except KeelError as err:  # not pending any more, the session stopped, ...
        return render(request, "error.html", status_code=409, title="Not decided",
                      message=str(err))
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)


async def branch(request: Request) -> Response:
    """A fork or a rewind from a record row's or a checkpoint's button: the session (or
    keel.branching) decides; a refusal is a page saying why."""
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    form = await _own_form(request)
    if form is None:
        return _refused()
    action = str(form.get("action", ""))
    try:
        seq = int(str(form.get("seq", "")))
        checkpoint = int(str(form["checkpoint"])) if form.get("checkpoint") else None
    except ValueError:
        return HTMLResponse("seq and checkpoint must be numbers", status_code=400)
    try:
        if action == "fork":
            done = await ctx.keel.fork(session_id, at_seq=None if checkpoint else seq,
                                       checkpoint=checkpoint)
            return RedirectResponse(f"/sessions/{done.session_id}", status_code=303)
        if action == "rewind":
            await ctx.keel.session(session_id).rewind(seq)
            return RedirectResponse(f"/sessions/{session_id}?from={seq}#m{seq}",
                                    status_code=303)
    except KeelError as err:  # a point inside a tool round, a session not idle, ...
        title = "Not forked" if action == "fork" else "Not rewound"
        return render(request, "error.html", status_code=409, title=title,
                      message=str(err))
    return HTMLResponse("action must be fork or rewind", status_code=400)


async def delete_page(request: Request) -> Response:
    """Deleting a session, asked once more: what goes and what stays, and the form."""
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    if not await session_known(ctx, session_id):
        return no_such_session(request, session_id)
    return render(request, "delete.html", title=f"Delete {session_id}?",
                  session_id=session_id)


async def delete(request: Request) -> Response:
    """The deletion itself (keel.deletion): a page saying what went, or why not (running,
    no vault worker, unknown)."""
    ctx = ui(request)
    session_id = request.path_params["session_id"]

    async def act(_handle: Any, form: Any) -> Response:
        done = await ctx.keel.delete_session(
            session_id, force=form.get("force") == "on", database_url=ctx.database_url,
            sub_agents=form.get("sub_agents") == "on")
        return render(request, "deleted.html", title=f"Deleted {session_id}",
                      session_id=session_id, lines=done.summary())
    return await _session_post(request, act, refused_title="Not deleted")


async def send(request: Request) -> Response:
    """A message from the person at the page, recorded as the user's, with the files chosen
    beside it (put in the workspace first: keel.uploads). The session's own checks apply:
    an empty or oversized text, a file it would refuse, is refused, saying why, and nothing
    is recorded; the page follows the turn that answers it."""
    ctx = ui(request)

    async def say(handle: Any, form: Any) -> Any:
        text = str(form.get("text") or "")
        refuse_before_sending(text)
        files = await _uploaded(ctx, handle.session_id, form)
        return await handle.send(text.replace("\r\n", "\n"), attachments=files)
    return await _session_post(request, say, refused_title="Not sent")


async def _uploaded(ctx: UiContext, session_id: str, form: FormData) -> list[str]:
    """The form's files (none chosen: none) in the session's workspace; their paths."""
    # The store's code loads only for a file.
    from activities.workspace import StoreError, open_store

    chosen = [f for f in form.getlist("files") if isinstance(f, UploadFile) and f.filename]
    if not chosen:
        return []
    most = ctx.settings.max_file_bytes
    uploads = uploads_checked([(str(f.filename), read_within(f.file, str(f.filename), most))
                               for f in chosen])
    url = ctx.database_url if ctx.settings.workspace_store == "postgres" else None
    try:
        return await put_uploads(open_store(ctx.settings, database_url=url, pooled=False),
                                 session_id, uploads)
    except StoreError as err:  # the workspace is full, say
        raise UploadRefused(f"{err}; nothing was sent") from None


async def interrupt(request: Request) -> Response:
    """The stop button: the running turn's model call is cancelled, what streamed kept."""
    return await _session_post(request, lambda handle, form: handle.interrupt())


async def budget(request: Request) -> Response:
    """A reached budget's answer: allow as much again of what was reached (the request the
    page showed: a request since then is not answered by it), raise the dollar limit by an
    amount, or refuse. The session refuses a raise that cannot let the turn go on."""
    async def answer(handle: Any, form: Any) -> Any:
        request_id = str(form.get("request_id") or "") or None
        if form.get("decision") == "refuse":
            return await handle.refuse_budget(request_id=request_id, by=DECIDED_BY)
        if form.get("decision") == "again":
            pending = (await handle.status()).budget_request
            if pending is None or request_id not in (None, pending.request_id):
                raise NoBudgetRequestError(f"budget request {request_id!r} is not pending")
            return await handle.raise_as_much_again(pending, by=DECIDED_BY)
        usd = str(form.get("usd") or "").strip()
        if not usd:
            raise ValueError("give the dollars to raise the limit by, or allow as much again")
        try:
            amount = float(usd)
        except ValueError:  # the page's field takes numbers only: another client sent this
            raise ValueError(f"the dollars to raise the limit by are a number such as 5 or "
                             f"2.50, not {usd[:40]!r}") from None
        return await handle.raise_budget(amount, request_id=request_id, by=DECIDED_BY)
    return await _session_post(request, answer)


async def _session_post(request: Request, act: Any, refused_title: str = "Not done",
                        ) -> Response:
    """A form posted on a session's page, from this UI's own page (else refused): `act`
    on the session's handle; its page (`act`'s response, else the session's again), or
    why it was not done."""
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    form = await _own_form(request)
    if form is None:
        return _refused()
    try:
        answer = await act(ctx.keel.session(session_id), form)
    except (KeelError, ValueError) as err:  # nothing pending, a bad amount, ...
        return render(request, "error.html", status_code=409, title=refused_title,
                      message=str(err))
    if isinstance(answer, Response):
        return answer
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)


# ----- checkpoints ------------------------------------------------------------------------

async def timeline(request: Request) -> HTMLResponse:
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    found = await _checkpoints(ctx, session_id)
    if not found and not await session_known(ctx, session_id):
        return no_such_session(request, session_id)
    return render(request, "checkpoints.html", title=f"{session_id}: checkpoints",
                  session_id=session_id, checkpoints=found)


async def checkpoint_page(request: Request) -> HTMLResponse:
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    number = request.path_params["number"]
    found = await _checkpoints(ctx, session_id)
    if not 1 <= number <= len(found):
        if not found and not await session_known(ctx, session_id):
            return no_such_session(request, session_id)
        return render(request, "error.html", status_code=404, title="No such checkpoint",
                      message=f"{session_id} has {len(found)} checkpoint(s); there is no "
                              f"checkpoint {number}.")
    current = found[number - 1]
    previous = found[number - 2] if number > 1 else None
    diff = mind_diff(previous.mind_text if previous else MindDocument.template().text,
                     current.mind_text)
    counts = {op: sum(1 for d in diff if d.op == op) for op in ("added", "removed",
                                                               "status")}
    return render(request, "checkpoint.html", title=f"{session_id}: checkpoint {number}",
                  session_id=session_id, cp=current, previous=previous, diff=diff,
                  counts=counts, total=len(found), page_size=ctx.page_size)


async def file_page(request: Request) -> Response:
    """A file a message carried, as the record keeps it: an image shown, a PDF or a text
    opened by the browser. Served sandboxed (no script of it runs as this UI) and by the
    kind Keel read from its bytes, never guessed again by the browser."""
    ctx = ui(request)
    session_id = request.path_params["session_id"]
    seq, index = request.path_params["seq"], request.path_params["index"]
    async with ctx.connection() as conn:
        found = await read_file_of(conn, session_id, seq, index)
    if found is None:
        return render(request, "error.html", status_code=404, title="No such file",
                      message=f"#{seq} of {session_id} has no file {index}.")
    item, data = found
    media_type = str(item.get("media_type") or "application/octet-stream")
    if media_type == "text/plain":
        media_type += "; charset=utf-8"
    name = str(item.get("name") or "file").replace('"', "'")
    return Response(data, media_type=media_type, headers={
        "Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff",
        "Cache-Control": "private, max-age=3600",
        "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}"})


# ----- the vault --------------------------------------------------------------------------

async def vault_page(request: Request) -> HTMLResponse:
    ctx = ui(request)
    query = (request.query_params.get("q") or "").strip()
    scope = _scope_asked(request)
    if scope is None:
        return _no_scope(request)
    view = await vault_view(ctx.settings, ctx.connection, query, scope)
    if scope not in (*view.scopes, DEFAULT_SCOPE):  # a mistyped scope: not an empty one
        return render(request, "error.html", status_code=404, title="No such scope",
                      message=unknown_scope_text(scope, view.scopes))
    return render(request, "vault.html", title="Vault", view=view, query=query,
                  hit_link=hit_link)


def _scope_asked(request: Request, form: Any = None) -> str | None:
    """The memory scope a page or form names (the default scope's when none), or None
    when it names no scope."""
    scope = str((form or request.query_params).get("scope") or DEFAULT_SCOPE)
    return scope if is_scope(scope) else None


async def _scope_form(request: Request) -> tuple[FormData, str] | Response:
    """A form of this UI's own that names a memory scope, and the scope; else the response
    refusing it."""
    form = await _own_form(request)
    if form is None:
        return _refused()
    scope = _scope_asked(request, form)
    if scope is None:
        return HTMLResponse("scope must be a memory scope's id", status_code=400)
    return form, scope


def _no_scope(request: Request) -> HTMLResponse:
    return render(request, "error.html", status_code=400, title="No such scope",
                  message="That is not a memory scope's id.")


async def erase_page(request: Request) -> Response:
    """Erasing a memory scope, asked once more: what goes, and the form."""
    scope = _scope_asked(request)
    if scope is None:
        return _no_scope(request)
    return render(request, "erase.html", title=f"Erase {scope}?", scope=scope)


async def erase(request: Request) -> Response:
    """The erasure itself (keel.scope_erase): a page saying what went, or why not (a
    session of it running, no vault worker, nothing there)."""
    ctx = ui(request)
    asked = await _scope_form(request)
    if isinstance(asked, Response):
        return asked
    form, scope = asked
    try:
        done = await ctx.keel.erase_memory_scope(
            scope, with_sessions=form.get("with_sessions") == "on",
            force=form.get("force") == "on", database_url=ctx.database_url)
    except KeelError as err:
        return render(request, "error.html", status_code=409, title="Not erased",
                      message=str(err))
    return render(request, "erased.html", scope=scope,
                  title=f"Erased {scope}" if done.found else "Nothing to erase",
                  said=erased_text(done), sessions=done.sessions_deleted, found=done.found,
                  status_code=200 if done.found else 404)


async def forget_page(request: Request) -> Response:
    """Forgetting one card, asked once more: what goes, what stays, and the form."""
    scope = _scope_asked(request)
    if scope is None:
        return _no_scope(request)
    card = str(request.query_params.get("card") or "")
    return render(request, "forget.html", title=f"Forget {card}?", scope=scope, card=card)


async def forget(request: Request) -> Response:
    """The forgetting itself (keel.card_forget): a page saying what went and what still
    names the card, or why not."""
    ctx = ui(request)
    asked = await _scope_form(request)
    if isinstance(asked, Response):
        return asked
    form, scope = asked
    try:
        done = await ctx.keel.forget_card(scope, str(form.get("card") or ""))
    except KeelError as err:
        return render(request, "error.html", status_code=409, title="Not forgotten",
                      message=str(err))
    return render(request, "forgot.html", scope=scope,
                  title=f"Forgot {done.title}" if done.path is not None else "Nothing forgotten",
                  said=forgotten_text(done), found=done.path is not None,
                  status_code=200 if done.path is not None else 404)


async def home(request: Request) -> Response:
    return RedirectResponse("/sessions", status_code=307)
