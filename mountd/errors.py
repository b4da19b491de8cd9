"""Error classes shared by storage, layouts and the tree, and the log-once rule.

Everything below the FUSE layer raises these; ``fuse_ops`` is the one place
that turns them into an errno. ``NotFound`` means "this name or key does not
exist" (ENOENT), ``Corrupt`` means stored bytes cannot be decoded (EIO),
``StorageError`` means the storage could not be read (EIO), ``Forbidden``
means a reference points somewhere it may not (EACCES).

``report_once`` logs an error the first time a given key fails, so one broken
object does not flood the log when the kernel retries it. It is plain
synchronous code over a set and is safe from any task or thread holding the GIL.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class MountError(Exception):
    """Base class for every error h5mount raises on purpose."""


class NotFound(MountError):
    """A key, object or name does not exist."""


class StorageError(MountError):
    """Storage could not be read. ``key`` names what was being read."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class Changed(StorageError):
    """The object is no longer the version a caller had (its etag differs)."""


class Corrupt(StorageError):
    """Stored bytes were read but are not valid for their format."""


class Forbidden(MountError):
    """A reference points at a location this mount may not read."""


class SourceError(MountError):
    """The mount source is unknown or unreadable; raised before mounting."""


_reported: set[str] = set()


def report_once(err: StorageError) -> None:
    """Log ``err`` unless an error for the same key was logged before."""
    if err.key in _reported:
        return
    _reported.add(err.key)
    log.error("cannot read %s: %s", err.key, err.reason)
