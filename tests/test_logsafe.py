"""Secrets are masked in every log record (mountd.logsafe)."""

from __future__ import annotations

import io
import logging

from mountd import logsafe


def test_secrets_are_masked_in_messages_args_and_tracebacks() -> None:
    secret = "logsafe-test-secret-0123456789"
    logsafe.add_secret(secret)
    logsafe.add_secret("short")  # too short to mask safely: ignored
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logsafe.RedactFilter())
    logger = logging.getLogger("botocore.endpoint.logsafe-test")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        logger.debug("headers %s", {"X-Amz-Security-Token": secret})
        logger.warning(f"inline {secret} text, short stays")  # noqa: G004 - the secret in msg
        try:
            raise ValueError(f"failed with {secret}")
        except ValueError:
            logger.exception("request failed")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert secret not in text
    assert text.count(logsafe.MASK) == 3 and "short stays" in text
    assert "ValueError: failed with <redacted>" in text


def test_chatty_libraries_are_held_at_info() -> None:
    logsafe.quiet_libraries(logging.DEBUG)
    assert logging.getLogger("botocore").getEffectiveLevel() == logging.INFO
    logsafe.quiet_libraries(logging.WARNING)
    assert logging.getLogger("httpcore").getEffectiveLevel() == logging.WARNING
