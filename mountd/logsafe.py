"""Keeping credentials out of the log and of what the daemon shows.

Owns the set of secret strings (AWS secret keys and session tokens) that no
log record may carry, ``redact``, which masks them and the secrets of every
URL in a text (``layouts.redact``: presigned query parameters, userinfo), and
the logging filter that applies it: every handler ``daemon.setup_logging``
installs has it, so records of every logger pass through it, third-party
ones included (botocore logs the signed request headers, session token and
all, at DEBUG; httpx logs every request's URL at INFO). Those chatty
libraries are also held at INFO whatever ``--log-level`` says
(``quiet_libraries``). The control files, ``fsname`` and systemd's
``STATUS=`` line show text through ``redact`` too.

The secrets kept are bounded: the ``MAX_SECRETS`` added last are kept (an S3
connection adds two each time its credentials rotate, so a mount running
for months would otherwise collect thousands and test every record against
each). A secret dropped that way is some 32 rotations old: the temporary
credentials it belonged to expired long ago. Adding a secret again
makes it the newest.

Concurrency: ``add_secret`` and the filter touch one ordered dict under the
GIL, with no I/O; records may come from any thread (``mask`` walks a copy).
``redact`` of a URL is pure.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from layouts import redact as urls

MASK = urls.MASK
#: Libraries whose DEBUG output is request plumbing (headers, hooks), not ours.
CHATTY = ("botocore", "aiobotocore", "urllib3", "httpcore", "httpx", "hpack", "hpack.hpack")
#: Secrets shorter than this are not masked (they would mask ordinary text).
MIN_SECRET = 8
#: Most secrets kept; the one added longest ago goes first.
MAX_SECRETS = 64

_secrets: OrderedDict[str, None] = OrderedDict()
#: Secrets added so far (one counter): what was redacted before a secret was
#: added must be redacted again before it is shown (``generation``).
_added = [0]


def generation() -> int:
    """A number that changes whenever a secret is added, for callers that
    keep redacted text."""
    return _added[0]


def add_secret(value: str | None) -> None:
    """Mask ``value`` in every log record from now on (while it is among the
    ``MAX_SECRETS`` added last)."""
    if value and len(value) >= MIN_SECRET:
        _added[0] += 1
        _secrets[value] = None
        _secrets.move_to_end(value)  # never out of the dict, not even for a moment
        while len(_secrets) > MAX_SECRETS:
            _secrets.popitem(last=False)


def mask(text: str) -> str:
    """``text`` with every known secret replaced by ``MASK``."""
    for secret in list(_secrets):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact(text: str) -> str:
    """``text`` with every known secret, and the secrets of every URL in it, masked."""
    return mask(urls.redact(text))


def redact_strings(value: Any) -> Any:
    """JSON-like ``value`` (settings, storage's metadata) with every string in it
    redacted; mappings (as dicts), lists and tuples are copied, their keys kept,
    other values as they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: redact_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_strings(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact_strings(item) for item in value)
    return value


class RedactFilter(logging.Filter):
    """Masks secrets (``redact``) in a record's message and traceback. The
    message is formatted here, once: the record keeps it, masked, as its ``msg``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def quiet_libraries(level: int) -> None:
    """Hold the ``CHATTY`` libraries at INFO or above."""
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(level, logging.INFO))
