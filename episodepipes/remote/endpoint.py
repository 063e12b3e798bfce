"""Where a remote root's requests go, from the root and the standard environment: plain HTTP, GCS emulators.

obstore reads most of the environment itself (``AWS_*``, ``GOOGLE_*``). Two choices are made here instead:
whether plain ``http://`` is allowed (only to a loopback host unless asked for, since credentials would
travel unencrypted), and the ``STORAGE_EMULATOR_HOST`` convention of Google's own clients (google-cloud-storage,
gcsfs), which obstore does not read: without it a client pointed at an emulator asks the cloud metadata
server for a token and fails.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is this machine (``localhost``, 127.0.0.0/8, ``::1``), by name only: nothing is resolved."""
    if not host:
        return False
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint(root: str) -> tuple[str, str] | None:
    """(where it was set, the URL) that ``root``'s requests go to, if the root or the environment names one."""
    scheme = root.split("://", 1)[0]
    if scheme in ("http", "https"):
        return f"root {root}", root
    names = {"s3": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"), "gs": ("GOOGLE_BASE_URL", EMULATOR_ENV)}.get(scheme, ())
    for name in names:
        value = os.environ.get(name)
        if value:
            return name, emulator_url(value) if name == EMULATOR_ENV else value
    return None


def emulator_url(value: str) -> str:
    """``STORAGE_EMULATOR_HOST`` as a URL: Google's clients take ``host:port`` to mean ``http://host:port``."""
    return value if "://" in value else f"http://{value}"


def allow_http(root: str, allowed: bool) -> bool:
    """Whether ``root``'s client may speak plain HTTP; a ValueError if it would have to, to a host not allowed.

    Plain HTTP is allowed to a loopback host (a local test server or emulator), or anywhere when ``allowed``
    (`RemoteOptions.allow_http`). An endpoint this cannot see (a service-account file's ``gcs_base_url``)
    gets HTTPS only unless ``allowed``: name a plain-HTTP emulator in ``GOOGLE_BASE_URL`` or
    ``STORAGE_EMULATOR_HOST`` instead.
    """
    if allowed:
        return True
    found = endpoint(root)
    if found is None or urlsplit(found[1]).scheme.lower() != "http":
        return False
    where, url = found
    host = urlsplit(url).hostname
    if is_loopback(host):
        return True
    raise ValueError(f"{where} is plain http:// to {host}: requests (and credentials) would travel unencrypted; "
                     "use https://, or pass RemoteOptions(allow_http=True) if that network is trusted")


def gcs_config(root: str) -> dict[str, str | bool]:
    """obstore config for a ``gs://`` root under ``STORAGE_EMULATOR_HOST``: the emulator, unsigned requests.

    Set only when ``GOOGLE_BASE_URL`` is not (obstore's own name for the endpoint wins). As with Google's clients,
    requests to the emulator are anonymous: it takes no credentials, and the metadata server is not asked.
    """
    value = os.environ.get(EMULATOR_ENV)
    if not root.startswith("gs://") or not value or os.environ.get("GOOGLE_BASE_URL"):
        return {}
    return {"base_url": emulator_url(value).rstrip("/"), "skip_signature": True}
