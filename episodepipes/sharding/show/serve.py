"""Serve the page on 127.0.0.1 only (``show --serve``): the page at ``/``, nothing else (no folder listing, no
other file), until interrupted. A browser on another machine cannot reach it; use an SSH tunnel for that."""

from __future__ import annotations

import http.server
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


def server(page: Path, port: int) -> http.server.ThreadingHTTPServer:
    """A server of ``page``'s bytes (read now) on ``HOST``:``port`` (0: a free port); the caller runs and closes
    it."""
    body = page.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] not in ("/", f"/{page.name}"):
                self.send_error(404, "only the page is served, at /")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.info("%s %s", self.address_string(), format % args)

    return http.server.ThreadingHTTPServer((HOST, port), Handler)


def serve(page: Path, port: int, say: Callable[[str], None]) -> None:
    """Serve ``page`` until Ctrl-C; ``say`` is told the URL once the port is bound."""
    with server(page, port) as httpd:
        say(f"serving {page} at http://{HOST}:{httpd.server_address[1]}/ (Ctrl-C stops)")
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:  # how a user stops it: not an error, nothing to resume
            pass
