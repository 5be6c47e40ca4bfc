"""A webhook receiver on a local port that keeps every post (`Webhook`, and the fixture
`webhook`), for the tests of the notices the vault's nightly runs send."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Webhook:
    def __init__(self):
        self.posts = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                hook.posts.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.stop()
