"""Bounded decompression: every decoder a chunk reader runs, capped at a size.

A hostile bucket or reference file may hold a chunk that decompresses to far
more than the chunk can be (a "decompression bomb"). Every chunk decoder in
``layouts`` undoes its compressors through this module, and each function
here is given ``limit``, the most bytes the output may have: the chunk's size
(``prod(chunk shape) * itemsize``) for fixed-size elements, plus what the
codecs after it add (a Fletcher32 checksum), or ``MAX_VLEN_CHUNK_BYTES`` for
variable-length data, whose size no metadata states. Output beyond the limit
is never produced: streams (zlib, gzip, bzip2, xz) are undone by incremental
decompressors with ``max_length`` one byte past the limit, and formats whose
header states the decoded size (Blosc, zstd, numcodecs LZ4) are refused on
that header, before anything is allocated. What a decoder allocates for
itself is bounded too: a bzip2 decoder takes under 4 MiB, an xz one at most
``LZMA_MEMLIMIT``. Any failure is ``Corrupt`` naming ``key``, so the reader
gets EIO for that chunk only. LZF is ``layouts.hdf5._lzf``'s.

libdeflate (the ``deflate`` package) inflates the gzip-compressed HDF5 chunks
of a typical file about 2.5 times faster than the standard ``zlib`` module,
and releases the GIL while it does, so decode threads run in parallel. It
allocates its whole output bound at once, so it is used only when the limit
is the size the output should have (``sized``), not a generous cap.
``fast_inflate`` gives None for anything libdeflate refuses (a corrupt
stream, or more output than the bound); ``inflate`` then runs ``zlib``, which
says exactly what is wrong. Blosc frames whose codec is zlib (every gzip
chunk HSDS writes) are likewise inflated with libdeflate by ``layouts.hdf5._blosc``;
``unblosc`` runs numcodecs for any frame that module leaves to it.

Pure functions over bytes; safe in any thread.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import deflate
import numcodecs

from layouts.errors import Corrupt
from layouts.hdf5 import _blosc

#: The most bytes a chunk of variable-length elements (or the JSON text a LINDI
#: ``json2`` chunk is) may decode to. Nothing states their size, so this is a
#: generous constant: 64 times the largest chunk HSDS aims for (4 MiB), and a
#: quarter of the largest reference file accepted (``lindi_refs.MAX_JSON_BYTES``).
MAX_VLEN_CHUNK_BYTES = 256 << 20
#: Most memory liblzma may take to decode one xz or lzma stream, its dictionary
#: included: the 65 MiB ``xz -9`` (a 64 MiB dictionary) needs, and a little more.
LZMA_MEMLIMIT = 72 << 20

#: Blosc 1 header: version, versionlz, flags, typesize, nbytes, blocksize, cbytes.
BLOSC_HEADER = _blosc.HEADER
_ZSTD_MAGIC = 0xFD2FB528
_LZ4_SIZE = struct.Struct("<I")
_GZIP_WBITS = 16 + zlib.MAX_WBITS


def fast_inflate(raw: bytes, limit: int) -> bytes | None:
    """The zlib stream ``raw`` inflated, if it is valid and holds at most ``limit`` bytes."""
    if limit <= 0:
        return None
    try:
        return deflate.zlib_decompress(raw, limit)
    except deflate.DeflateError:
        return None


def inflate(raw: bytes, limit: int, key: str, *, sized: bool = True) -> bytes:
    """The zlib stream ``raw`` inflated: at most ``limit`` bytes, else Corrupt.

    ``sized`` says ``limit`` is the size the output should have, so libdeflate
    may allocate it up front; pass False when ``limit`` is only a cap.
    """
    if sized:
        fast = fast_inflate(raw, limit)
        if fast is not None:
            return fast
    inflater = zlib.decompressobj()
    try:
        # max_length 0 means "no limit" to zlib; limit + 1 is always at least 1.
        data = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise Corrupt(key, f"zlib decompression failed: {exc}") from exc
    if len(data) > limit:
        raise Corrupt(key, f"zlib stream holds more than the chunk's {limit} bytes")
    if not inflater.eof:
        raise Corrupt(key, "zlib stream is truncated")
    if inflater.unused_data:
        raise Corrupt(key, f"{len(inflater.unused_data)} bytes after the zlib stream")
    return data


class _Decompressor(Protocol):
    """What ``zlib.decompressobj``, ``bz2.BZ2Decompressor`` and ``lzma.LZMADecompressor`` share."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int, /) -> bytes: ...


def _streams(raw: bytes, limit: int, key: str, codec: str,
             start: Callable[[], _Decompressor], *, padded: bool = False) -> bytes:
    """``raw`` as a run of whole streams, each undone by a decompressor from ``start``,
    as Python's ``gzip``, ``bz2`` and ``lzma`` modules read them (``padded``: zero
    bytes may follow a stream, as in gzip): at most ``limit`` bytes in all, else
    Corrupt. No decompressor is let make more than one byte past the limit."""
    parts: list[bytes] = []
    done = 0
    rest = raw
    while rest:
        try:
            stream = start()
            # a max_length of 0 means "no limit" to zlib; limit + 1 - done is at least 1
            part = stream.decompress(rest, limit + 1 - done)
        except (zlib.error, OSError, EOFError, ValueError, lzma.LZMAError) as exc:
            raise Corrupt(key, f"{codec} decompression failed: {exc}") from exc
        done += len(part)
        if done > limit:
            raise Corrupt(key, f"{codec} data holds more than the chunk's {limit} bytes")
        if not stream.eof:
            raise Corrupt(key, f"{codec} data is truncated")
        parts.append(part)
        rest = stream.unused_data.lstrip(b"\0") if padded else stream.unused_data
    return b"".join(parts)


def gunzip(raw: bytes, limit: int, key: str) -> bytes:
    """The gzip data ``raw`` inflated as Python's ``gzip`` reads it (any number of
    members, zero padding after each; no bytes at all are no data): at most
    ``limit`` bytes, else Corrupt."""
    return _streams(raw, limit, key, "gzip", lambda: zlib.decompressobj(_GZIP_WBITS),
                    padded=True)


def bunzip2(raw: bytes, limit: int, key: str) -> bytes:
    """The bzip2 data ``raw`` (numcodecs ``BZ2``, the HDF5 bzip2 filter) decompressed as
    ``bz2.decompress`` does (any number of streams): at most ``limit`` bytes, else
    Corrupt. A bzip2 decoder needs under 4 MiB of its own, whatever the stream says."""
    return _streams(raw, limit, key, "bzip2", bz2.BZ2Decompressor)


def unxz(raw: bytes, limit: int, key: str, fmt: int = lzma.FORMAT_XZ) -> bytes:
    """The xz or lzma-alone data ``raw`` (numcodecs ``LZMA``) decompressed as
    ``lzma.decompress`` does: at most ``limit`` bytes, else Corrupt.

    A stream's header states the dictionary liblzma allocates before decoding
    anything; the decoder is held to ``LZMA_MEMLIMIT``, what the strongest
    preset needs. ``FORMAT_RAW`` takes no memory limit, so it is refused.
    """
    if fmt not in (lzma.FORMAT_XZ, lzma.FORMAT_ALONE, lzma.FORMAT_AUTO):
        raise Corrupt(key, f"lzma format {fmt} cannot be held to a memory limit")
    return _streams(raw, limit, key, "lzma",
                    lambda: lzma.LZMADecompressor(fmt, memlimit=LZMA_MEMLIMIT))


def blosc_sizes(raw: bytes) -> tuple[int, int, int] | None:
    """(version, nbytes, cbytes) of the Blosc 1 header ``raw`` starts with, if it is long
    enough to have one and its typesize is not 0."""
    if len(raw) < BLOSC_HEADER.size:
        return None
    version, _, _, typesize, nbytes, _, cbytes = BLOSC_HEADER.unpack_from(raw)
    if typesize == 0:
        return None
    return version, nbytes, cbytes


def unblosc(raw: bytes, limit: int, key: str) -> bytes:
    """The Blosc frame ``raw`` decompressed; Corrupt unless its header says it is
    exactly ``len(raw)`` bytes (c-blosc trusts that and would read past the end)
    holding at most ``limit``. A zlib frame is decoded by ``_blosc.decode``
    (libdeflate); numcodecs decodes whatever that leaves, allocating the header's
    ``nbytes`` and no more, and refusing a block size larger than that."""
    sizes = blosc_sizes(raw)
    if sizes is None:
        raise Corrupt(key, "not a Blosc frame (too short, or typesize 0)")
    version, nbytes, cbytes = sizes
    if not 1 <= version <= 5 or cbytes != len(raw) or nbytes > limit:
        raise Corrupt(key, f"not a Blosc frame of {limit} bytes or fewer "
                      f"(version {version}, {nbytes} bytes in {cbytes} of {len(raw)})")
    fast = _blosc.decode(raw, limit, key)
    if fast is not None:
        return fast
    data = _decoded(key, "Blosc", numcodecs.blosc.decompress, raw)
    if len(data) != nbytes:
        raise Corrupt(key, f"Blosc frame decodes to {len(data)} bytes, not {nbytes}")
    return data


def _decoded(key: str, codec: str, decode: Callable[[bytes], Any], raw: bytes) -> bytes:
    """``decode(raw)`` as bytes, once its input was checked against the limit;
    a numcodecs failure is Corrupt for ``key``."""
    try:
        return bytes(decode(raw))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise Corrupt(key, f"{codec} decompression failed: {exc}") from exc


def zstd_content_size(raw: bytes) -> int | None:
    """The content size a zstd frame header declares, or None if it declares none."""
    if len(raw) < 5 or int.from_bytes(raw[:4], "little") != _ZSTD_MAGIC:
        return None
    descriptor = raw[4]
    single_segment = bool(descriptor & 0x20)
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    size = ((1 if single_segment else 0), 2, 4, 8)[descriptor >> 6]
    if size == 0 or pos + size > len(raw):
        return None
    value = int.from_bytes(raw[pos:pos + size], "little")
    return value + 256 if size == 2 else value


def unzstd(raw: bytes, limit: int, key: str) -> bytes:
    """The zstd data ``raw`` decompressed; Corrupt unless its first frame declares a
    content size of at most ``limit``.

    numcodecs allocates exactly the declared size and decodes with libzstd's
    one-shot API into it, which fails rather than write more (so further frames
    cannot add to it). A frame that declares no size is refused: bounding it would
    need a streaming decoder with an output cap, which numcodecs does not offer
    (numcodecs 0.15 refuses such frames itself; later versions stream them
    without a bound).
    """
    declared = zstd_content_size(raw)
    if declared is None or declared > limit:
        raise Corrupt(key, f"not a zstd frame of {limit} bytes or fewer "
                      f"(declares {declared})")
    data = _decoded(key, "zstd", numcodecs.Zstd().decode, raw)
    if len(data) > limit:  # defensive: the one-shot API cannot exceed the declared size
        raise Corrupt(key, f"zstd data holds more than the chunk's {limit} bytes")
    return data


def unlz4(raw: bytes, limit: int, key: str) -> bytes:
    """numcodecs ``LZ4`` data (a little-endian uint32 decoded size, then one LZ4 block)
    decompressed; Corrupt unless the size it states is at most ``limit``. numcodecs
    allocates that size and LZ4's safe decoder never writes past it."""
    if len(raw) < _LZ4_SIZE.size:
        raise Corrupt(key, "too short for LZ4 data")
    (declared,) = _LZ4_SIZE.unpack_from(raw)
    if declared > limit:
        raise Corrupt(key, f"LZ4 data states {declared} bytes, more than the chunk's {limit}")
    data = _decoded(key, "LZ4", numcodecs.lz4.decompress, raw)
    if len(data) != declared:
        raise Corrupt(key, f"LZ4 data decodes to {len(data)} bytes, not {declared}")
    return data
