"""``layouts.hdf5._inflate.fast_inflate``: libdeflate where it can, None where the caller's
zlib path must decide (and say what is wrong)."""

from __future__ import annotations

import os
import zlib

from layouts.hdf5._inflate import fast_inflate

DATA = os.urandom(1000) + bytes(100_000)
STREAM = zlib.compress(DATA, 6)


def test_valid_stream_equals_zlib() -> None:
    assert fast_inflate(STREAM, len(DATA)) == DATA
    assert fast_inflate(STREAM, len(DATA) + 5000) == DATA


def test_more_output_than_the_limit_is_left_to_zlib() -> None:
    assert fast_inflate(STREAM, len(DATA) - 1) is None
    assert fast_inflate(STREAM, 0) is None


def test_corrupt_or_truncated_stream_is_left_to_zlib() -> None:
    assert fast_inflate(STREAM[:-10], len(DATA)) is None
    broken = bytearray(STREAM)
    broken[len(broken) // 2] ^= 0xFF
    assert fast_inflate(bytes(broken), len(DATA)) is None
    assert fast_inflate(b"not zlib at all", len(DATA)) is None
