"""Keel's web UI (`keel ui`, and beside the worker in `keel dev`).

    app.py        the Starlette app: routes, pages, the live relay (server-sent events)
    views.py      what the pages compute without I/O: mind diff, conversation, gauge
    vault.py      the vault as shown: CORE.md, cards by type with History, transcript, search
    approvals.py  the one door to approvals (the client's methods, where it has them)
    security.py   Host check, access token, CSRF rule
    server.py     binding and running uvicorn in the caller's event loop

It reads through `keel.client`, `keel.record` and `keel.events`, the code the CLI uses, and
holds no session logic of its own.
"""
