"""Keel's web UI (`keel ui`, and beside the worker in `keel dev`).

    app.py        the Starlette app: routes, middleware, the context on `app.state`
    context.py    the `UiContext` every handler reads, and rendering a page
    pages.py      the pages, module-level handlers: sessions, a session, checkpoints, vault
    live.py       the live relay (server-sent events): record, status, event stream
    views.py      what the pages compute without I/O: mind diff, conversation, gauge
    vault.py      the vault as shown: CORE.md, cards by type with History, transcript, search
    approvals.py  the one door to approvals (the client's pending, approve, deny)
    security.py   Host check, access token, CSRF rule
    server.py     binding and running uvicorn in the caller's event loop

It reads through `keel.client`, `keel.record` and `keel.events`, the code the CLI uses, and
holds no session logic of its own.
"""
