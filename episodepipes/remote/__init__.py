"""Remote dataset roots (``s3://``, ``gs://``, ``http(s)://``): the object-store byte source and its parts."""

from .cache import RangeCache
from .ranges import Request, coalesce
from .source import RemoteOptions, RemoteSource

__all__ = ["RangeCache", "RemoteOptions", "RemoteSource", "Request", "coalesce"]
