"""Serving the UI: bind (loopback unless a token is set), run uvicorn in this event loop.

    async with ui_server(keel, settings, database_url) as url:
        print(url)  # http://127.0.0.1:8765/sessions

Invariant: the socket is bound before the URL is returned, so the printed URL answers;
`keel ui` and `keel dev` both start the UI through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn

from keel.client import KeelClient
from keel.ui.app import UiContext, create_app
from keel.ui.security import check_bind, is_loopback, loopback_hosts
from schemas.config import KeelSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the caller (`keel ui`, `keel dev`) owns
    Ctrl-C and stops the server by leaving `ui_server`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def ui_server(keel: KeelClient, settings: KeelSettings, database_url: str, *,
                    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                    token: str | None = None, temporal_ui: str | None = None,
                    page_size: int = 200) -> AsyncIterator[str]:
    """Serve the UI until the block ends; yields its URL (with the token, if any)."""
    check_bind(host, token)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    ctx = UiContext(keel=keel, database_url=database_url, settings=settings,
                    temporal_ui=temporal_ui, token=token, page_size=page_size,
                    allowed_hosts=loopback_hosts(bound) if is_loopback(host) else None)
    config = uvicorn.Config(create_app(ctx), log_level="warning", lifespan="off",
                            access_log=False, timeout_graceful_shutdown=1)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if task.done():
        task.result()  # the error that stopped it
    shown = host if is_loopback(host) or host not in ("0.0.0.0", "::") else socket.getfqdn()
    shown = f"[{shown}]" if ":" in shown and not shown.startswith("[") else shown
    url = f"http://{shown}:{bound}/sessions" + (f"?token={token}" if token else "")
    try:
        yield url
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 5)
        sock.close()
