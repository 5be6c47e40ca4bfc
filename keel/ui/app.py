"""The web UI: sessions, a session's record and context, its checkpoints, the vault.

A small server-rendered Starlette app. `create_app` only builds it: the routes to the
module-level pages (`keel.ui.pages`) and the live relay (`keel.ui.live`), the static files,
the guard; the one `UiContext` they all read goes on `app.state.ctx`. The UI reads only
through what the CLI reads through: the session's queries via `keel.client`, the record and
checkpoints via `keel.record`, the event stream via `keel.events`, the vault via
`activities.vault`; approvals go through `keel.ui.approvals`. It holds no session logic and
writes nothing but a person's decision on an approval and a fork or rewind they asked
for (through `keel.client`).

Invariants:
- Every page is bounded: the record is shown a page at a time (`page_size` rows, picked by
  seq on the record's key), whatever the record's length.
- Templates autoescape: text with markup in it is shown as text, never rendered.
- A session or call id in a path holds no control character (`_Segment`): such a path
  matches no route (404), never reaching a query.
- `keel.ui.security.Guard` wraps the app: Host check on loopback, the access token when one
  is set; every POST carries the process's CSRF token (form field and SameSite cookie)
  and a same-origin Origin (or Referer).
- PostgreSQL away is a page that says so in its own words (503) within `DB_WAIT_S`, not a
  bare "Internal Server Error" after the pool's half a minute.
"""

from __future__ import annotations

import psycopg
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp
from temporalio.exceptions import ApplicationError

from activities.db import DATABASE_UNAVAILABLE
from keel.ui import pages
from keel.ui.context import HERE, UiContext, render
from keel.ui.live import live
from keel.ui.security import Guard

__all__ = ["UiContext", "create_app"]


class _Segment(Convertor[str]):
    """A path segment that can name a session or a call: no control character (a NUL in a
    query would be PostgreSQL's error, a 500). Anything else matches no route: a 404."""

    regex = "[^/\x00-\x1f\x7f]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("segment", _Segment())


async def _database_away(request: Request, exc: Exception) -> Response:
    """PostgreSQL away (`activities.db.connection`'s reason, or a connection it broke):
    a 503 page naming it; any other failure stays a 500."""
    if isinstance(exc, ApplicationError) and exc.type != DATABASE_UNAVAILABLE:
        raise exc  # the server's own 500, its traceback logged
    reason = exc.message if isinstance(exc, ApplicationError) else \
        f"PostgreSQL: {' '.join(str(exc).split())[:300]}"
    return render(request, "error.html", status_code=503,
                  title="The record cannot be read now", message=reason)


async def _form_too_large(request: Request, exc: Exception) -> Response:
    return render(request, "error.html", status_code=413, title="Not sent",
                  message=str(exc))


def create_app(ctx: UiContext) -> ASGIApp:
    """The UI over `ctx`, behind its guard."""
    routes = [
        Route("/", pages.home),
        Route("/sessions", pages.sessions),
        Route("/sessions/{session_id:segment}", pages.session_page),
        Route("/sessions/{session_id:segment}/approvals", pages.approvals_fragment),
        Route("/sessions/{session_id:segment}/approvals/{call_id:segment}", pages.decide,
              methods=["POST"]),
        Route("/sessions/{session_id:segment}/branch", pages.branch, methods=["POST"]),
        Route("/sessions/{session_id:segment}/interrupt", pages.interrupt, methods=["POST"]),
        Route("/sessions/{session_id:segment}/send", pages.send, methods=["POST"]),
        Route("/sessions/{session_id:segment}/delete", pages.delete_page),
        Route("/sessions/{session_id:segment}/delete", pages.delete, methods=["POST"]),
        Route("/sessions/{session_id:segment}/budget", pages.budget, methods=["POST"]),
        Route("/sessions/{session_id:segment}/checkpoints", pages.timeline),
        Route("/sessions/{session_id:segment}/checkpoints/{number:int}", pages.checkpoint_page),
        Route("/sessions/{session_id:segment}/live", live),
        Route("/sessions/{session_id:segment}/files/{seq:int}/{index:int}", pages.file_page),
        Route("/vault", pages.vault_page),
        Route("/vault/erase", pages.erase_page),
        Route("/vault/erase", pages.erase, methods=["POST"]),
        Route("/vault/forget", pages.forget_page),
        Route("/vault/forget", pages.forget, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={
        ApplicationError: _database_away, psycopg.OperationalError: _database_away,
        pages.FormTooLarge: _form_too_large})
    app.state.ctx = ctx
    return Guard(app, ctx)
