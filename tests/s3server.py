"""Local servers for the remote tests and benchmark: moto's S3 server, a fault-injecting proxy, a ranged HTTP server.

Everything listens on 127.0.0.1 with a free port and stops by itself when closed. The proxy counts what a
client really asked for and received (requests, body bytes), which is what the coalescing tests assert on.
"""

from __future__ import annotations

import http.client
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from moto.server import ThreadedMotoServer

# Fake credentials for moto; the secret-leak tests look for these exact values in every message.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIATESTKEYID0000001", "AWS_SECRET_ACCESS_KEY": "s3cr3t-Test-Secret-Value-42",
               "AWS_DEFAULT_REGION": "us-east-1"}


class MotoS3:
    """moto's S3 server in a thread on 127.0.0.1 (a real HTTP server, not a patched client)."""

    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def client(self):  # noqa: ANN201 - boto3 client, used by tests to create buckets and upload
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def upload_dir(self, local: Path, bucket: str, prefix: str) -> None:
        """Create ``bucket`` (if needed) and put every file of ``local`` under ``prefix/``."""
        c = self.client()
        if bucket not in {b["Name"] for b in c.list_buckets().get("Buckets", [])}:
            c.create_bucket(Bucket=bucket)
        for p in sorted(Path(local).iterdir()):
            if p.is_file():
                c.put_object(Bucket=bucket, Key=f"{prefix}/{p.name}", Body=p.read_bytes())

    def close(self) -> None:
        self._server.stop()


@dataclass
class Faults:
    """What the proxy does to each request: delay it, answer 503 SlowDown, or cut the body halfway.

    ``puts_ok``: after this many PUTs have been forwarded, every further PUT answers 503 (a store that
    stops accepting writes mid-run, as an interrupted upload sees it). A dropped request with no body (a
    PUT's answer) is forwarded, then its connection is cut before the answer: the client must retry.
    """

    latency: float = 0.0
    error_rate: float = 0.0
    drop_rate: float = 0.0
    seed: int = 0
    puts_ok: int | None = None
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 drops SYNs when a client opens dozens of connections at once


class Served:
    """A `_Server` on a free 127.0.0.1 port, answering in a thread: the test servers' and proxies' shared start/stop."""

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that timed out and hung up is part of the tests, not a server fault


class FaultProxy(Served):
    """A forwarding HTTP/1.1 proxy in front of ``upstream`` that injects `Faults` and counts traffic.

    ``requests`` lists ``(method, path, Range header)`` of every request received; ``body_bytes`` sums the
    response bodies actually sent to the client (cut bodies count what was sent); ``peak`` is the most
    requests that were being handled at once.
    """

    def __init__(self, upstream: str, faults: Faults | None = None) -> None:
        m = re.fullmatch(r"http://([^:/]+):(\d+)", upstream)
        if not m:
            raise ValueError(f"{upstream=} should be http://host:port")
        self.faults = faults or Faults()
        self.requests: list[tuple[str, str, str | None]] = []
        self.body_bytes = 0
        self.peak = self._active = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Forward):
            up_host, up_port = m.group(1), int(m.group(2))
            owner = proxy

        self._serve(Handler)

    def reset(self, faults: Faults | None = None) -> None:
        """Clear the counters and set new faults (none by default)."""
        with self._lock:
            self.requests, self.body_bytes, self.faults, self.peak = [], 0, faults or Faults(), 0

    def gets(self) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "GET"]

    def puts(self) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "PUT"]

    def _decide(self, method: str) -> str:
        with self._lock:
            f = self.faults
            x = f.rng.random()
            if method == "PUT" and f.puts_ok is not None:
                if f.puts_ok <= 0:
                    return "503"
                f.puts_ok -= 1
        return "503" if x < f.error_rate else "drop" if x < f.error_rate + f.drop_rate else "ok"

    def _record(self, method: str, path: str, rng: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, rng))
            self._active += 1
            self.peak = max(self.peak, self._active)

    def _done(self) -> None:
        with self._lock:
            self._active -= 1

    def _sent(self, n: int) -> None:
        with self._lock:
            self.body_bytes += n



class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    up_host: str
    up_port: int
    owner: FaultProxy

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _upstream(self) -> http.client.HTTPConnection:
        conn = getattr(self, "_conn", None)
        if conn is None:
            conn = self._conn = http.client.HTTPConnection(self.up_host, self.up_port, timeout=30)
        return conn

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.owner._record(self.command, self.path, self.headers.get("Range"))
        self._open = True
        try:
            self._forward(body)
        finally:
            self._finish()

    def _finish(self) -> None:
        # Called just before the last write: once the client has its answer it may send the next request.
        if self._open:
            self._open = False
            self.owner._done()

    def _forward(self, body: bytes) -> None:
        owner = self.owner
        if owner.faults.latency:
            time.sleep(owner.faults.latency)
        fate = owner._decide(self.command)
        if fate == "503":
            msg = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self._finish()
            if self.command != "HEAD":
                self.wfile.write(msg)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
        try:
            conn = self._upstream()
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            self._conn = None
            raise
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length", "server",
                                 "date"):
                self.send_header(k, v)
        length = int(resp.getheader("Content-Length") or len(data)) if self.command == "HEAD" else len(data)
        self.send_header("Content-Length", str(length))
        if fate == "drop" and (len(data) <= 1 or self.command == "HEAD"):  # forwarded, but the answer is lost
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self._finish()
        self.end_headers()
        if self.command == "HEAD":
            return
        if fate == "drop":
            half = data[: len(data) // 2]
            owner._sent(len(half))  # counted before sending: the client may return before this thread resumes
            self.wfile.write(half)
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the client sees a connection reset mid-body
            return
        owner._sent(len(data))
        self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


class RangeHTTPServer(Served):
    """Serves the files of one folder over plain HTTP with ``Range: bytes=a-b`` support (GET and HEAD)."""

    def __init__(self, root: Path) -> None:
        folder = Path(root)

        class Handler(_Ranged):
            base = folder

        self.requests: list[str] = []
        Handler.log = self.requests
        self._serve(Handler)



class _Ranged(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    base: Path
    log: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, status: int, body: bytes, extra: dict[str, str], total: int | None = None) -> None:
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if total is None else total))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.log.append(f"{self.command} {self.path} {self.headers.get('Range')}")
        name = self.path.lstrip("/")
        path = self.base / name
        if "/" in name or ".." in name or not path.is_file():
            return self._reply(404, b"not found", {})
        data = path.read_bytes()
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if not m:
            return self._reply(200, data, {"Accept-Ranges": "bytes"})
        start = int(m.group(1))
        end = min(int(m.group(2)) + 1 if m.group(2) else len(data), len(data))
        if start >= len(data):
            return self._reply(416, b"", {"Content-Range": f"bytes */{len(data)}"})
        return self._reply(206, data[start:end], {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}",
                                                  "Accept-Ranges": "bytes"})

    do_HEAD = do_GET


def s3_env(endpoint: str) -> dict[str, str]:
    """The standard AWS environment pointing at ``endpoint`` (what a user would export)."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


def set_env(env: dict[str, str]) -> dict[str, str | None]:
    """Set ``env`` in os.environ and return the previous values, for `restore_env`."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return old


def restore_env(old: dict[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class ServerProcess:
    """moto and one `FaultProxy` per latency in a child process, so their CPU and GIL are not the client's.

    For the benchmark: ``endpoints[i]`` is the proxy with ``latencies[i]``; `stats` and `reset` reach its counters.
    """

    def __init__(self, latencies: tuple[float, ...]) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, latencies), daemon=True)
        self._proc.start()
        self.moto_endpoint, self.endpoints = self._conn.recv()

    def _ask(self, *msg: object) -> object:
        self._conn.send(msg)
        return self._conn.recv()

    def upload_dir(self, local: Path, bucket: str, prefix: str) -> None:
        self._ask("upload", str(local), bucket, prefix)

    def reset(self, i: int) -> None:
        self._ask("reset", i)

    @property
    def pid(self) -> int:
        """The server process's id: the remote benchmark reads its CPU time."""
        return self._proc.pid  # type: ignore[return-value]

    def stats(self, i: int) -> tuple[int, int]:
        """(GET requests, body bytes) through proxy ``i`` since its last reset."""
        return self._ask("stats", i)  # type: ignore[return-value]

    def close(self) -> None:
        self._ask("stop")
        self._proc.join(10)


def _serve(conn: object, latencies: tuple[float, ...]) -> None:
    moto = MotoS3()
    proxies = [FaultProxy(moto.endpoint, Faults(latency=lat)) for lat in latencies]
    conn.send((moto.endpoint, [p.endpoint for p in proxies]))  # type: ignore[attr-defined]
    while True:
        cmd, *args = conn.recv()  # type: ignore[attr-defined]
        if cmd == "upload":
            moto.upload_dir(Path(args[0]), args[1], args[2])
            conn.send(None)  # type: ignore[attr-defined]
        elif cmd == "reset":
            p = proxies[args[0]]
            p.reset(Faults(latency=p.faults.latency))
            conn.send(None)  # type: ignore[attr-defined]
        elif cmd == "stats":
            p = proxies[args[0]]
            conn.send((len(p.gets()), p.body_bytes))  # type: ignore[attr-defined]
        else:
            for p in proxies:
                p.close()
            moto.close()
            conn.send(None)  # type: ignore[attr-defined]
            return
