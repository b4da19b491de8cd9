"""The one mapping of failures to errno, and the log-once rule (layouts.errors)."""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict

import pytest

from layouts import errors
from mountd.errors import Corrupt, Forbidden, NotFound, StorageError
from mountd.fuse_ops import errno_of


def test_errno_of_each_kind(caplog: pytest.LogCaptureFixture) -> None:
    assert errno_of(NotFound("k")) == errno.ENOENT
    assert errno_of(Forbidden("k", "local file")) == errno.EACCES
    assert errno_of(Corrupt("errors-test/corrupt", "bad")) == errno.EIO
    assert errno_of(StorageError("errors-test/io", "reset")) == errno.EIO
    with caplog.at_level(logging.ERROR, logger="layouts.errors"):
        for _ in range(3):
            assert errno_of(KeyError("bug"), "read 7") == errno.EIO
    bugs = [r for r in caplog.records if "unexpected error in read 7" in r.getMessage()]
    assert len(bugs) == 1 and bugs[0].exc_info is not None  # once, with its traceback


def test_reported_keys_are_bounded(caplog: pytest.LogCaptureFixture,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "REPORTED_MAX", 5)
    monkeypatch.setattr(errors, "_reported", OrderedDict())  # whatever tests before logged
    with caplog.at_level(logging.ERROR, logger="layouts.errors"):
        for i in range(50):
            errors.report_once(StorageError(f"errors-test/bounded/{i}", "gone"))
        assert len(errors._reported) <= 5
        errors.report_once(StorageError("errors-test/bounded/49", "gone"))  # still known
        errors.report_once(StorageError("errors-test/bounded/0", "gone"))  # forgotten: again
    logged = [r.getMessage() for r in caplog.records if "errors-test/bounded/" in r.getMessage()]
    assert len(logged) == 51
