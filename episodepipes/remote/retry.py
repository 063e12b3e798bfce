"""Retrying one object-store call: which failures are transient, the backoff, and errors that leak nothing."""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import ShardIOError

log = logging.getLogger(__name__)
T = TypeVar("T")
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "GOOGLE_SERVICE_ACCOUNT_KEY")


class Missing(ShardIOError):
    """The object does not exist (404)."""


class NotSatisfiable(ShardIOError):
    """The range starts past the object's end (416): the object is shorter than the index says."""


class Changed(ShardIOError):
    """The object is no longer the version a conditional GET asked for (412): it was replaced since."""


def call(fn: Callable[[], T], *, where: str, attempts: int, backoff: float, max_backoff: float) -> T:
    """``fn()``, retried with exponential backoff and jitter on transient failures.

    Raises `Missing`, `NotSatisfiable`, `Changed`, or a `ShardIOError` starting with ``where`` (the object and range)
    once the failure is final or ``attempts`` are used up. Causes are cut to one line with credentials and
    URL queries blanked and control characters escaped (they may quote a server's error body, printed to a
    terminal), and not chained, so a traceback shows no more than the message.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except FileNotFoundError:  # obstore's NotFoundError
            raise Missing(where) from None
        except Exception as e:  # obstore raises its own classes; sorted by `transient`
            cause = printable(redact(str(e).split("\n", 1)[0][:300]))
            status = _status(cause)
            if status == 416:
                raise NotSatisfiable(where) from None
            if status == 412:
                raise Changed(where) from None
            if not transient(e, status):
                raise ShardIOError(f"{where}: {cause}") from None
            if attempt == attempts:
                raise ShardIOError(f"{where}: failed after {attempts} attempts; last error: {cause}") from None
            delay = min(max_backoff, backoff * 2 ** (attempt - 1))
            log.info("retrying %s in %.2fs (attempt %d of %d): %s", where, delay, attempt, attempts, cause)
            time.sleep(delay / 2 + random.uniform(0, delay / 2))
    raise ValueError(f"{attempts=} should be >= 1")


def _status(text: str) -> int | None:
    m = re.search(r"status code: (\d{3})", text)
    return int(m.group(1)) if m else None


def transient(e: Exception, status: int | None) -> bool:
    """Throttling (429, 503 SlowDown), 5xx, timeouts and broken connections are retried; other 4xx are final."""
    from obstore import exceptions as ox

    if isinstance(e, ox.PermissionDeniedError | ox.UnauthenticatedError | ox.InvalidPathError |
                  ox.NotSupportedError | ox.UnknownConfigurationKeyError):
        return False
    if status is not None and 400 <= status < 500:
        return status in (408, 429)
    return isinstance(e, ox.GenericError | OSError | TimeoutError)


def redact(text: str) -> str:
    """``text`` with any credential from the environment and any URL query (signatures) blanked out."""
    for k in _SECRET_ENV:
        v = os.environ.get(k)
        if v and len(v) >= 4:
            text = text.replace(v, "***")
    return re.sub(r"\?\S*", "?***", text)


def printable(text: str) -> str:
    """``text`` with every character that is not printable (terminal control sequences, carriage returns,
    bidirectional overrides) written as its Python escape, so a server's words cannot act on a terminal or a log."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
