"""A static file server with byte ranges on 127.0.0.1, for the ``http(s)://`` root tests.

Python's `http.server` answers every GET with the whole file, so this one adds what a CDN or an object
store's public endpoint does: ``Range: bytes=a-b`` (also ``a-`` and ``-n``) answered 206 with
``Content-Range``, 416 past the end, ``ETag``, ``Last-Modified``, ``Accept-Ranges`` and ``Content-Length``
on GET and HEAD. It counts what it sends, on the server's side: every request and every body byte.
"""

from __future__ import annotations

import email.utils
import re
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

from s3server import Served

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class RangeServer(Served):
    """Serves the folder tree ``root`` over HTTP/1.1 on 127.0.0.1, a free port, in a thread.

    ``requests`` lists ``(method, path, Range header)`` of every request; ``body_bytes`` sums the bodies sent.
    """

    def __init__(self, root: Path) -> None:
        owner = self
        self.root = Path(root).resolve()
        self.requests: list[tuple[str, str, str | None]] = []
        self.body_bytes = 0
        self._lock = threading.Lock()

        class Handler(_Handler):
            server_of = owner

        self._serve(Handler)

    def reset(self) -> None:
        with self._lock:
            self.requests, self.body_bytes = [], 0

    def gets(self) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "GET"]

    def _record(self, method: str, path: str, rng: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, rng))

    def _sent(self, n: int) -> None:
        with self._lock:
            self.body_bytes += n



class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_of: RangeServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _file(self) -> Path | None:
        parts = unquote(urlsplit(self.path).path).split("/")[1:]
        if not parts or any(p in ("", ".", "..") for p in parts):
            return None
        path = self.server_of.root.joinpath(*parts)
        return path if path.is_file() else None

    def _reply(self, status: int, headers: dict[str, str], length: int) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def do_GET(self) -> None:
        rng = self.headers.get("Range")
        self.server_of._record(self.command, self.path, rng)
        path = self._file()
        if path is None:
            body = b"not found"
            self._reply(404, {"Content-Type": "text/plain"}, len(body))
            if self.command == "GET":
                self.wfile.write(body)
            return
        st = path.stat()
        size = st.st_size
        meta = {"ETag": f'"{st.st_ino:x}-{size:x}-{st.st_mtime_ns:x}"', "Accept-Ranges": "bytes",
                "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
                "Content-Type": "application/octet-stream"}
        start, end, status = 0, size, 200
        m = _RANGE.fullmatch(rng.strip()) if rng else None
        if m and (m.group(1) or m.group(2)):  # a single range; several (a comma) are answered in full, as allowed
            if not m.group(1):  # bytes=-n: the last n
                start = max(0, size - int(m.group(2)))
            else:
                start = int(m.group(1))
                end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            if start >= size or start >= end:
                self._reply(416, {"Content-Range": f"bytes */{size}"}, 0)
                return
            status = 206
            meta["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._reply(status, meta, end - start)
        if self.command != "GET":
            return
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        self.server_of._sent(len(data))  # counted before sending: the client may return before this thread resumes
        self.wfile.write(data)

    do_HEAD = do_GET
