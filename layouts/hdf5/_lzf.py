"""LZF streams (h5py's ``lzf`` filter, HDF5 filter 32000) decoded into a buffer of a set size.

Owns ``unlzf``. h5py's filter, which libhdf5 runs, starts from the chunk's
size and retries with ever larger buffers until the stream fits, so a stream
can make it allocate about 88 times its own size, far more than its chunk.
Here the decoder is the same liblzf ``lzf_decompress`` h5py builds into its
``h5py.h5z`` extension (and exports), called once through ctypes with an
output buffer of ``limit`` bytes: liblzf checks every literal
run and back reference against the end of that buffer, and, as h5py builds it
(``CHECK_INPUT``), against the end of the input, and fails (``E2BIG``,
``EINVAL``) rather than read or write past either. So a stream is decoded, or
refused as ``Corrupt``, having allocated ``limit`` bytes and no more.

The format, for reading the checks: a control byte below 32 starts a literal
run of that many bytes plus one; any other is a back reference of
``(ctrl >> 5) + 2`` bytes (a length of 7 takes one more byte, 9 to 264 bytes
in all) at a distance of ``(ctrl & 31) << 8`` plus the next byte plus one.

If the loaded h5py lacks the symbol, every LZF stream is ``Corrupt`` ("no
bounded LZF decoder"): never left to an unbounded one.

Concurrency: ctypes releases the GIL for the call; the only state is the
function, looked up once (``functools.cache``). Safe from any thread.
"""

from __future__ import annotations

import ctypes
import errno
import functools
from typing import Any

from layouts.errors import Corrupt

#: liblzf takes and returns sizes as C ``unsigned int``.
_UINT_MAX = (1 << 32) - 1


@functools.cache
def _lzf_decompress() -> Any:
    """liblzf's ``lzf_decompress`` from h5py's ``h5z`` extension, or None if it has none."""
    from h5py import h5z  # noqa: PLC0415  (h5py loads libhdf5: only LZF chunks need it)

    try:
        func = ctypes.CDLL(h5z.__file__, use_errno=True).lzf_decompress
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_uint
    func.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]
    return func


def unlzf(raw: bytes, limit: int, key: str) -> bytes:
    """The LZF stream ``raw`` decoded: at most ``limit`` bytes, else Corrupt."""
    decompress = _lzf_decompress()
    if decompress is None:
        raise Corrupt(key, "no bounded LZF decoder (h5py's h5z exports no lzf_decompress)")
    if not raw:  # liblzf reads a first control byte whatever the input length
        raise Corrupt(key, "empty LZF stream")
    if len(raw) > _UINT_MAX or limit > _UINT_MAX:
        raise Corrupt(key, f"LZF stream of {len(raw)} bytes, or {limit} decoded, is too large")
    src = raw if isinstance(raw, bytes) else bytes(raw)
    out = bytearray(limit)
    target = (ctypes.c_char * limit).from_buffer(out)
    size = decompress(src, len(src), target, limit)
    if size == 0:
        if ctypes.get_errno() == errno.E2BIG:
            raise Corrupt(key, f"LZF stream holds more than the chunk's {limit} bytes")
        raise Corrupt(key, "not a valid LZF stream")
    del target  # a bytearray cannot be resized while ctypes holds its buffer
    del out[size:]
    return out
