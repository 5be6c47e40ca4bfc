"""Who may use the UI: the Host check, the access token, and the CSRF rule for POSTs.

Invariants: on loopback (the default) only Host headers naming the bound port on
127.0.0.1 / localhost / [::1] are served, so a page on another site cannot reach the UI
through DNS rebinding. Any other address is refused unless an access token is set; then
every request carries it (`?token=` once, which sets an HttpOnly SameSite=Strict cookie,
or `Authorization: Bearer`). A state-changing request (POST) needs the process's CSRF
token both in its form and in its SameSite=Strict cookie, and an Origin (or, lacking one,
a Referer) of the UI's own origin.
"""

from __future__ import annotations

import ipaddress
import secrets
from typing import Protocol
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

CSRF_COOKIE = "keel_csrf"
TOKEN_COOKIE = "keel_ui_token"


class UnsafeBindError(ValueError):
    """A non-loopback address without an access token."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise UnsafeBindError(
            f"the UI binds {host}, which is not loopback: set KEEL_UI_TOKEN (or --token) so "
            "only people with the token can use it")


def loopback_hosts(port: int) -> set[str]:
    return {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")}


class _Settings(Protocol):
    token: str | None
    allowed_hosts: set[str] | None


class Guard:
    """ASGI middleware: Host check and access token, before any route runs."""

    def __init__(self, app: ASGIApp, ctx: _Settings) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        allowed = self.ctx.allowed_hosts
        if allowed is not None and request.headers.get("host", "") not in allowed:
            await PlainTextResponse("unknown Host", status_code=421)(scope, receive, send)
            return
        token = self.ctx.token
        if token:
            supplied = (request.query_params.get("token") or request.cookies.get(TOKEN_COOKIE)
                        or request.headers.get("authorization", "").removeprefix("Bearer "))
            if not secrets.compare_digest(supplied.encode(), token.encode()):
                await PlainTextResponse("a token is needed", status_code=401)(
                    scope, receive, send)
                return
            if "token" in request.query_params:  # once: into a cookie, out of the URL
                rest = urlencode([(k, v) for k, v in request.query_params.multi_items()
                                  if k != "token"])
                response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""),
                                            status_code=303)
                response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def csrf_ok(request: Request, expected: str, form_token: str) -> bool:
    """The POST came from one of the UI's own pages."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not (form_token and cookie and secrets.compare_digest(form_token, expected)
            and secrets.compare_digest(cookie, expected)):
        return False
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == own
    referer = request.headers.get("referer")
    return referer is not None and _origin(referer) == own


