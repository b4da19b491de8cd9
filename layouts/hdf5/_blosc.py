"""Blosc 1 frames whose codec is zlib, decoded with libdeflate instead of c-blosc.

HSDS stores every gzip-filtered chunk as a Blosc 1 frame with the zlib codec
(numcodecs' ``Blosc(cname="zlib")``), which numcodecs inflates with plain zlib.
This module owns that frame format as c-blosc 1.21 (the version numcodecs
bundles) reads it, and ``decode`` gives exactly the bytes
``numcodecs.blosc.decompress`` gives, inflating each stream with libdeflate
(about twice as fast as zlib on HSDS chunks here, and without the GIL)
straight to the size the frame says it has.

The frame, all integers little-endian:

- a 16-byte header (``HEADER``): format version (2), codec format version
  (1 for zlib), flags, typesize, ``nbytes`` (decoded size), ``blocksize``,
  ``cbytes`` (frame size). Flags: ``DOSHUFFLE`` (bytes shuffled; ignored for
  typesize 1), ``MEMCPYED`` (the ``nbytes`` follow the header as they are),
  ``DOBITSHUFFLE`` (bits shuffled), 0x08 (reserved: c-blosc refuses it),
  ``DONT_SPLIT``, and the codec in the top three bits (``ZLIB_FORMAT``);
- unless memcpyed, one int32 per block: where the block starts in the frame.
  The data is cut into ``blocksize`` blocks, the last one (the leftover)
  holding the rest;
- each block is one stream, or ``typesize`` streams (one per byte of the
  type) when ``DONT_SPLIT`` is clear, the typesize at most ``MAX_SPLITS``,
  the block holds at least ``MIN_SPLIT_ELEMENTS`` elements and is not the
  leftover. A stream is an int32 size and that many bytes; it decodes to the
  block's size divided by the number of streams, and a stream of exactly that
  size is stored raw;
- byte shuffle: a block's ``n = size // typesize`` elements are stored as
  ``typesize`` planes of ``n`` bytes (plane ``j`` holds byte ``j`` of every
  element), then the ``size % typesize`` bytes that fill no element, as they
  are. Bit shuffle (a block of at least one element): bitshuffle's transform
  of the ``n`` elements then the rest as it is, when ``n`` is a multiple of
  8, else the whole block as it is.

``decode`` gives None for anything it does not handle: another codec, format
version or codec version, the reserved flag or both shuffles, sizes c-blosc
refuses, an offset or stream size out of the frame, a stream libdeflate
refuses or that does not fill its part. The caller (``inflate.unblosc``) then
runs numcodecs, which decodes it or says what is wrong. ``Corrupt`` (naming
``key``) is raised, before anything is allocated, for a frame stating more
than ``limit`` decoded bytes or a size other than its own, and for one whose
output c-blosc would partly leave as whatever its buffers held (split blocks
whose size is not a whole number of elements). libdeflate accepts a few
malformed deflate streams that zlib refuses (the reserved length symbols 286
and 287 among them); it checks each stream's Adler-32 all the same, so such a
frame decodes here to the bytes that were compressed (short of a corruption
that also matches the checksum, which zlib cannot tell either) where numcodecs
refuses it.

Pure functions over bytes, no shared state: safe in any thread. libdeflate
and numpy's copies release the GIL, so decode threads run in parallel.
"""

from __future__ import annotations

import struct

import deflate
import numpy as np

from layouts.decoding import OUTPUT
from layouts.errors import Corrupt

#: Blosc 1 header: version, versionlz, flags, typesize, nbytes, blocksize, cbytes.
HEADER = struct.Struct("<BBBBIII")
#: The Blosc format version c-blosc 1.x writes and the only one it reads.
VERSION = 2
#: Codec format of zlib (the flags' top three bits), and its format version.
ZLIB_FORMAT = 3
ZLIB_VERSION = 1
DOSHUFFLE = 0x01
MEMCPYED = 0x02
DOBITSHUFFLE = 0x04
RESERVED = 0x08
DONT_SPLIT = 0x10
#: The largest typesize whose blocks are split, and the fewest elements a split block holds.
MAX_SPLITS = 16
MIN_SPLIT_ELEMENTS = 128
_INT32_MAX = (1 << 31) - 1
#: c-blosc's BLOSC_MAX_BLOCKSIZE: (INT_MAX - BLOSC_MAX_TYPESIZE * sizeof(int32_t)) / 3.
MAX_BLOCKSIZE = (_INT32_MAX - 255 * 4) // 3
_INT32 = struct.Struct("<i")


def decode(raw: bytes, limit: int, key: str) -> bytearray | memoryview | None:
    """The Blosc 1 zlib frame ``raw`` decoded, as numcodecs decodes it, into a buffer
    from ``layouts.decoding.OUTPUT``; None if this module does not handle it (the
    caller runs numcodecs). Corrupt if its header
    states more than ``limit`` bytes or a frame size other than ``len(raw)``, or if
    c-blosc would leave part of the output unwritten."""
    if len(raw) < HEADER.size:
        return None
    version, versionlz, flags, typesize, nbytes, blocksize, cbytes = HEADER.unpack_from(raw)
    if nbytes > limit:
        raise Corrupt(key, f"Blosc frame holds {nbytes} bytes, more than the chunk's {limit}")
    if cbytes != len(raw):
        raise Corrupt(key, f"Blosc frame says {cbytes} bytes but has {len(raw)}")
    if (version != VERSION or versionlz != ZLIB_VERSION or flags >> 5 != ZLIB_FORMAT
            or flags & RESERVED or (flags & DOSHUFFLE and flags & DOBITSHUFFLE)
            or typesize == 0 or not 0 < blocksize <= min(nbytes, MAX_BLOCKSIZE)
            or cbytes > _INT32_MAX):
        return None
    if flags & MEMCPYED:
        return bytearray(raw[HEADER.size:]) if cbytes == nbytes + HEADER.size else None
    nblocks = -(-nbytes // blocksize)
    if nblocks > (cbytes - HEADER.size) // 4:
        return None
    # every block but the leftover is split, or none is
    split = (not flags & DONT_SPLIT and typesize <= MAX_SPLITS
             and blocksize // typesize >= MIN_SPLIT_ELEMENTS)
    if split and blocksize % typesize:
        raise Corrupt(key, f"Blosc blocks of {blocksize} bytes split in {typesize} streams")
    starts = struct.unpack_from(f"<{nblocks}i", raw, HEADER.size)
    decoded = OUTPUT.take(nbytes)  # returned as is: a copy costs a quarter of the decode
    out = np.frombuffer(decoded, np.uint8)
    view = memoryview(raw)
    for index, start in enumerate(starts):
        first = index * blocksize
        size = min(blocksize, nbytes - first)
        count = typesize if split and size == blocksize else 1
        streams = _streams(view, start, count, size // count)
        if streams is None:
            return None
        if not _unshuffle(streams, flags, typesize, out[first:first + size]):
            return None
    return decoded


def _streams(view: memoryview, offset: int, count: int, size: int) -> list[np.ndarray] | None:
    """The ``count`` streams of ``size`` bytes each that start at ``offset`` of the
    frame ``view``, decoded; None if one lies outside the frame or libdeflate
    refuses it (bounds as c-blosc checks them)."""
    cbytes = len(view)
    streams = []
    for _ in range(count):
        if not 0 <= offset <= cbytes - _INT32.size:
            return None
        (csize,) = _INT32.unpack_from(view, offset)
        offset += _INT32.size
        if not 0 <= csize <= cbytes - offset:
            return None
        if csize == size:
            streams.append(np.frombuffer(view, np.uint8, size, offset))
        else:
            try:
                data = deflate.zlib_decompress(view[offset:offset + csize], size)
            except deflate.DeflateError:
                return None
            if len(data) != size:
                return None
            streams.append(np.frombuffer(data, np.uint8))
        offset += csize
    return streams


def _unshuffle(streams: list[np.ndarray], flags: int, typesize: int, block: np.ndarray) -> bool:
    """Write into ``block`` what its decoded ``streams`` hold, with the shuffle of
    ``flags`` undone; False if the bit shuffle cannot be undone here."""
    size = len(block)
    elements = size // typesize
    whole = elements * typesize
    if flags & DOSHUFFLE and typesize > 1:
        if len(streams) == typesize:
            planes = streams
        else:
            (data,) = streams
            planes = [data[j * elements:(j + 1) * elements] for j in range(typesize)]
            block[whole:] = data[whole:]
        grid = block[:whole].reshape(elements, typesize)
        for j, plane in enumerate(planes):
            grid[:, j] = plane
        return True
    data = streams[0] if len(streams) == 1 else np.concatenate(streams)
    if flags & DOBITSHUFFLE and size >= typesize and elements % 8 == 0:
        try:
            from bitshuffle.ext import untrans_bit_elem  # noqa: PLC0415  (bitshuffled only)
        except ImportError:
            return False
        block[:whole] = untrans_bit_elem(data[:whole].view(f"V{typesize}")).view(np.uint8)
        block[whole:] = data[whole:]
        return True
    block[:] = data
    return True
