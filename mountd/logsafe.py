"""Keeping credentials out of the log.

Owns the set of secret strings (AWS secret keys and session tokens) that no
log record may carry, and the logging filter that masks them: every handler
``daemon.setup_logging`` installs has it, so records of every logger pass
through it, third-party ones included (botocore logs the signed request
headers, session token and all, at DEBUG). Those chatty libraries are also
held at INFO whatever ``--log-level`` says (``quiet_libraries``).

The secrets kept are bounded: the ``MAX_SECRETS`` added last are kept (an S3
connection adds two each time its credentials rotate, so a mount running
for months would otherwise collect thousands and test every record against
each). A secret dropped that way is some 32 rotations old: the temporary
credentials it belonged to expired long ago. Adding a secret again
makes it the newest.

Concurrency: ``add_secret`` and the filter touch one ordered dict under the
GIL, with no I/O; records may come from any thread (``mask`` walks a copy).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

MASK = "<redacted>"
#: Libraries whose DEBUG output is request plumbing (headers, hooks), not ours.
CHATTY = ("botocore", "aiobotocore", "urllib3", "httpcore", "httpx", "hpack", "hpack.hpack")
#: Secrets shorter than this are not masked (they would mask ordinary text).
MIN_SECRET = 8
#: Most secrets kept; the one added longest ago goes first.
MAX_SECRETS = 64

_secrets: OrderedDict[str, None] = OrderedDict()


def add_secret(value: str | None) -> None:
    """Mask ``value`` in every log record from now on (while it is among the
    ``MAX_SECRETS`` added last)."""
    if value and len(value) >= MIN_SECRET:
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


class RedactFilter(logging.Filter):
    """Replaces every known secret in a record's message and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _secrets:
            return True
        message = record.getMessage()
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text)
        return True


def quiet_libraries(level: int) -> None:
    """Hold the ``CHATTY`` libraries at INFO or above."""
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(level, logging.INFO))
