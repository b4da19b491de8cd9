"""The errors layouts raise and catch, and the log-once rule: a port of ``layouts/``.

Formats, and the stores and resolvers the daemon gives them, raise these;
``mountd`` re-exports them (``mountd.errors``) and ``mountd.fuse_ops`` is the
one place that turns them into an errno. ``LayoutError`` is the base of every
error raised on purpose. ``NotFound`` means "this name or key does not exist"
(ENOENT), ``Corrupt`` means stored bytes cannot be decoded (EIO),
``StorageError`` means the storage could not be read (EIO), ``Forbidden``
means a reference points somewhere it may not (EACCES), ``SourceError`` means
a source cannot be mounted at all (raised before mounting). ``FormatError``
is not one of them: it is raised inside a format, where the storage key is
not known, and the caller turns it into ``Corrupt`` naming the key.

Messages never show a URL's secrets: ``str()`` of a ``LayoutError`` is its
message masked by ``layouts.redact`` (the stores raise them with whole URLs,
which their ``key`` keeps), so a message is safe wherever it ends up: a log
line, stderr, the ``h5mount_left_out`` of a ``D.h5``.

``report_once`` logs an error the first time a given key fails, so one broken
object does not flood the log when the kernel retries it; ``report_unexpected``
does the same for exceptions that are bugs (with their traceback). The keys
logged are remembered in an LRU of the ``REPORTED_MAX`` (10,000) keys
reported last, so a mount that meets millions of broken objects does not
grow without end; a key forgotten that way is logged again when it fails
again, which is harmless (one more line). Plain synchronous code, safe from
any task or thread holding the GIL.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from layouts.redact import redact

log = logging.getLogger(__name__)


class LayoutError(Exception):
    """Base class for every error h5mount raises on purpose; its message is
    shown with the secrets of URLs masked."""

    def __str__(self) -> str:
        return redact(super().__str__())


class NotFound(LayoutError):
    """A key, object or name does not exist."""


class StorageError(LayoutError):
    """Storage could not be read. ``key`` names what was being read."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class Changed(StorageError):
    """The object is no longer the version a caller had (its etag differs)."""


class Corrupt(StorageError):
    """Stored bytes were read but are not valid for their format."""


class Missing(StorageError):
    """A file a reference names does not exist (a linked data file): unlike a
    failed read, reading it again will not help."""


class Forbidden(LayoutError):
    """A reference points at a location this mount may not read."""


class SourceError(LayoutError):
    """The mount source is unknown or unreadable; raised before mounting."""


class FormatError(ValueError):
    """Stored metadata or data does not follow its format (no key named yet)."""


#: Most keys remembered as already logged.
REPORTED_MAX = 10_000
_reported: OrderedDict[str, None] = OrderedDict()


def first_report(key: str) -> bool:
    """True the first time ``key`` is seen (since it was last forgotten)."""
    try:
        _reported.move_to_end(key)  # one call: no gap for another thread to evict it in
    except KeyError:
        _reported[key] = None
        if len(_reported) > REPORTED_MAX:
            _reported.popitem(last=False)
        return True
    return False


def report_once(err: StorageError) -> None:
    """Log ``err`` unless an error for the same key was logged before."""
    if first_report(err.key):
        log.error("cannot read %s", err)


def report_unexpected(where: str, exc: BaseException) -> None:
    """Log an exception that is a bug, with its traceback, once per place and kind."""
    if first_report(f"{where}: {type(exc).__name__}: {exc}"):
        log.error("unexpected error in %s", where, exc_info=exc)
