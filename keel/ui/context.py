"""What every handler reads: one `UiContext`, fixed when the app starts and kept on
`app.state.ctx`; and the one way a page is rendered.

Invariants: the context is built once and only read afterwards (the handlers hold no state
of their own between requests); its Jinja environment autoescapes, so text with markup in it
is shown as text, never rendered, and shows every plain string a page prints as the
terminal does (`schemas.text.visible`: a control code or a bidi override a session's text
holds is shown by its picture, so no record row, tool input an approval asks about, file or
card reorders what a person reads); every rendered page sets the process's CSRF token in an
HttpOnly SameSite=Strict cookie, the same token its forms carry.
"""

from __future__ import annotations

import json
import secrets
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from psycopg import AsyncConnection
from starlette.requests import Request
from starlette.responses import HTMLResponse

from activities.db import connection
from keel.client import KeelClient
from keel.ui.security import CSRF_COOKIE
from schemas.budget import as_much_again
from schemas.config import KeelSettings
from schemas.text import visible

__all__ = ["HERE", "UiContext", "make_env", "render", "ui"]

HERE = Path(__file__).parent
# How long a page waits for a connection of the record's pool.
DB_WAIT_S = 5.0


def _shown(value: Any) -> Any:
    """What a page prints of `value`: a plain string as `visible` shows it; markup a
    template or filter made (`Markup`: a form, `tojson`) as it is."""
    return visible(value) if isinstance(value, str) and not isinstance(value, Markup) \
        else value


def make_env() -> Environment:
    """The templates' environment: autoescape on, and the few filters the pages use."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True, finalize=_shown)
    env.filters["n"] = lambda v: f"{int(v or 0):,}"
    env.filters["allowance"] = lambda request: as_much_again(request)[1]
    env.filters["when"] = lambda v: (v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                                     if isinstance(v, datetime) else "—")
    env.filters["pretty"] = lambda v: (json.dumps(v, indent=1, ensure_ascii=False)
                                       if isinstance(v, dict | list) else str(v))
    return env


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
    env: Environment = field(default_factory=make_env, init=False, repr=False)

    def workflow_url(self, session_id: str) -> str | None:
        if not self.temporal_ui:
            return None
        ns = self.settings.temporal_namespace
        return f"{self.temporal_ui.rstrip('/')}/namespaces/{ns}/workflows/{session_id}"

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection of the process-wide pool (`async with ctx.connection() as conn`),
        waited for at most `DB_WAIT_S`: a page a person waits on says PostgreSQL is away
        (`keel.ui.app`'s 503) rather than hang for the pool's half a minute."""
        return connection(self.database_url, wait_s=DB_WAIT_S)


def ui(request: Request) -> UiContext:
    """The context of the app serving `request` (set by `keel.ui.app.create_app`)."""
    ctx: UiContext = request.app.state.ctx
    return ctx


def render(request: Request, name: str, status_code: int = 200, **values: Any
           ) -> HTMLResponse:
    """Template `name` as the response, with the CSRF token in its forms and its cookie."""
    ctx = ui(request)
    html = ctx.env.get_template(name).render(request=request, ctx=ctx, csrf=ctx.csrf,
                                             **values)
    response = HTMLResponse(html, status_code=status_code)
    response.set_cookie(CSRF_COOKIE, ctx.csrf, httponly=True, samesite="strict")
    return response
