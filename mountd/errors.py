"""The error vocabulary of ``mountd``: the errors of the layouts' port, by their mountd names.

The error types and the log-once rule belong to ``layouts.errors`` (imports
run ``mountd`` -> ``layouts`` only); this module re-exports the same objects,
so mountd code imports its errors from one place. ``MountError`` is
``layouts.errors.LayoutError`` itself: ``except MountError`` catches every
error raised on purpose, by a store, a format or the daemon. ``fuse_ops`` is
the one place that turns them into an errno.
"""

from __future__ import annotations

from layouts.errors import (
    Changed,
    Corrupt,
    Forbidden,
    LayoutError,
    NotFound,
    SourceError,
    StorageError,
    report_once,
    report_unexpected,
)

#: The base of every error h5mount raises on purpose (``layouts.errors.LayoutError``).
MountError = LayoutError

__all__ = [
    "Changed",
    "Corrupt",
    "Forbidden",
    "MountError",
    "NotFound",
    "SourceError",
    "StorageError",
    "report_once",
    "report_unexpected",
]
