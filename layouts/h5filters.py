"""Decoding chunks exactly as an HDF5 file stores them (linked HSDS datasets).

Owns ``Pipeline`` (what a dataset's HSDS ``filters`` JSON means for an HDF5
chunk) and ``decode``, which turns the stored bytes of one HDF5 chunk into the
raw element bytes of the whole chunk. This differs from ``layouts.hsds_chunks``:
HSDS's own chunks are Blosc frames, while an HDF5 file holds each filter's
output as the HDF5 filter plugin writes it.

The filters are undone in the fixed order HDF5 (as written by h5py) applies
them last to first, whatever order the JSON lists them in:

1. Fletcher32 (id 3): a 4-byte checksum after the data, verified and removed.
   ``hsload`` drops this filter from the JSON it sends to HSDS, so an
   unlisted checksum is accepted too, when the chunk does not decode without
   it and its last 4 bytes are the Fletcher32 of the rest.
2. One compressor: deflate (id 1, a zlib stream), Blosc (32001, a Blosc frame),
   Zstandard (32015, one zstd frame) or LZ4 (32004, the HDF5 LZ4 plugin's
   framing: big-endian 8-byte total size, 4-byte block size, then each block
   as a 4-byte big-endian length and the LZ4 block, or the block itself when
   it did not compress). No compressor is allowed to produce more than the
   chunk's size: the sizes headers declare are checked before decoding.
3. Byte shuffle (id 2) by the element size.

Anything else (szip, lzf, scale-offset, n-bit, bitshuffle, user filters) makes
``Pipeline.unknown`` say so; every chunk read then fails, metadata still works.

Concurrency: pure functions over bytes, safe in any thread; ``decode`` is what
callers run in a worker thread for large chunks.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from layouts.hsds_chunks import filter_classes
from layouts.inflate import fast_inflate
from mountd.errors import Corrupt

FLETCHER32_SIZE = 4
_BLOSC_HEADER = struct.Struct("<BBBBIII")
_LZ4_HEADER = struct.Struct(">qi")
_LZ4_BLOCK = struct.Struct(">i")
_ZSTD_MAGIC = 0xFD2FB528

_COMPRESSORS = {"H5Z_FILTER_DEFLATE": "deflate", "H5Z_FILTER_BLOSC": "blosc",
                "H5Z_FILTER_LZ4": "lz4", "H5Z_FILTER_ZSTD": "zstd"}


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The HDF5 filters of one dataset, as far as decoding needs them."""

    fletcher32: bool = False
    compressor: str | None = None
    shuffle: bool = False
    #: Description of the first filter that cannot be undone, if any.
    unknown: str | None = None


def pipeline(filters: Any) -> Pipeline:
    """Interpret HSDS filter JSON (a list of ``{class, id, name, ...}``)."""
    fletcher32 = shuffle = False
    compressor: str | None = None
    unknown: str | None = None
    for named, item in filter_classes(filters):
        name = item.get("name")
        # HSDS spells bitshuffle as a shuffle filter named "bitshuffle".
        bitshuffle = named == "H5Z_FILTER_SHUFFLE" and name not in (None, "shuffle")
        cls = None if bitshuffle else named
        if cls == "H5Z_FILTER_NONE":
            continue
        if cls == "H5Z_FILTER_FLETCHER32":
            fletcher32 = True
        elif cls == "H5Z_FILTER_SHUFFLE":
            shuffle = True
        elif cls in _COMPRESSORS and compressor is None:
            compressor = _COMPRESSORS[cls]
        elif unknown is None:
            unknown = f"{item.get('class')} (id {item.get('id')}, name {name})"
    return Pipeline(fletcher32, compressor, shuffle, unknown)


def _fletcher32_strip(raw: bytes, key: str) -> bytes:
    """``raw`` without its trailing checksum; Corrupt if the checksum is wrong."""
    if len(raw) < FLETCHER32_SIZE:
        raise Corrupt(key, "chunk is shorter than its Fletcher32 checksum")
    try:
        return bytes(numcodecs.Fletcher32().decode(raw))
    except RuntimeError as exc:
        raise Corrupt(key, f"Fletcher32 checksum mismatch: {exc}") from exc


def _fletcher32_ok(raw: bytes) -> bool:
    """True if ``raw`` ends in the Fletcher32 checksum of the bytes before it."""
    if len(raw) <= FLETCHER32_SIZE:
        return False
    try:
        numcodecs.Fletcher32().decode(raw)
    except (RuntimeError, ValueError):
        return False
    return True


def _inflate(raw: bytes, expected: int, key: str) -> bytes:
    fast = fast_inflate(raw, expected)
    if fast is not None:
        return fast
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(raw, expected + 1)
    except zlib.error as exc:
        raise Corrupt(key, f"zlib decompression failed: {exc}") from exc
    if len(data) > expected:
        raise Corrupt(key, f"zlib stream holds more than the chunk's {expected} bytes")
    if not inflater.eof:
        raise Corrupt(key, "zlib stream is truncated")
    if inflater.unused_data:
        raise Corrupt(key, f"{len(inflater.unused_data)} bytes after the zlib stream")
    return data


def _unblosc(raw: bytes, expected: int, key: str) -> bytes:
    if len(raw) < _BLOSC_HEADER.size:
        raise Corrupt(key, "too short for a Blosc frame")
    version, _, _, _, nbytes, _, cbytes = _BLOSC_HEADER.unpack_from(raw)
    if not 1 <= version <= 5 or cbytes != len(raw) or nbytes != expected:
        raise Corrupt(key, f"not a Blosc frame of {expected} bytes "
                      f"(version {version}, {nbytes} bytes in {cbytes})")
    try:
        return bytes(numcodecs.blosc.decompress(raw))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise Corrupt(key, f"Blosc decompression failed: {exc}") from exc


def _zstd_content_size(raw: bytes) -> int | None:
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


def _unzstd(raw: bytes, expected: int, key: str) -> bytes:
    declared = _zstd_content_size(raw)
    if declared != expected:
        raise Corrupt(key, f"not a zstd frame of {expected} bytes (declares {declared})")
    try:
        return bytes(numcodecs.Zstd().decode(raw, out=np.empty(expected, dtype=np.uint8)))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise Corrupt(key, f"zstd decompression failed: {exc}") from exc


def _unlz4(raw: bytes, expected: int, key: str) -> bytes:
    if len(raw) < _LZ4_HEADER.size:
        raise Corrupt(key, "too short for an HDF5 LZ4 header")
    total, block = _LZ4_HEADER.unpack_from(raw)
    if total != expected or block <= 0:
        raise Corrupt(key, f"bad LZ4 header (total {total}, block {block} bytes)")
    pos = _LZ4_HEADER.size
    parts: list[bytes] = []
    done = 0
    while done < total:
        want = min(block, total - done)
        if pos + _LZ4_BLOCK.size > len(raw):
            raise Corrupt(key, f"LZ4 data ends inside a block header at byte {pos}")
        (size,) = _LZ4_BLOCK.unpack_from(raw, pos)
        pos += _LZ4_BLOCK.size
        if size <= 0 or pos + size > len(raw):
            raise Corrupt(key, f"LZ4 block of {size} bytes at byte {pos} overruns the data")
        part = raw[pos:pos + size]
        pos += size
        if size != want:
            try:
                part = bytes(numcodecs.lz4.decompress(struct.pack("<I", want) + part))
            except (RuntimeError, ValueError) as exc:
                raise Corrupt(key, f"LZ4 decompression failed: {exc}") from exc
            if len(part) != want:
                raise Corrupt(key, f"LZ4 block decodes to {len(part)} bytes, not {want}")
        parts.append(part)
        done += want
    if pos != len(raw):
        raise Corrupt(key, f"{len(raw) - pos} bytes after the LZ4 blocks")
    return b"".join(parts)


def _decode_once(raw: bytes, pipe: Pipeline, itemsize: int, nbytes: int, key: str) -> bytes:
    data = raw
    if pipe.fletcher32:
        data = _fletcher32_strip(data, key)
    if pipe.compressor == "deflate":
        data = _inflate(data, nbytes, key)
    elif pipe.compressor == "blosc":
        data = _unblosc(data, nbytes, key)
    elif pipe.compressor == "zstd":
        data = _unzstd(data, nbytes, key)
    elif pipe.compressor == "lz4":
        data = _unlz4(data, nbytes, key)
    if len(data) != nbytes:
        raise Corrupt(key, f"chunk decodes to {len(data)} bytes, expected {nbytes}")
    if pipe.shuffle and itemsize > 1:
        data = bytes(np.frombuffer(data, dtype=np.uint8).reshape(itemsize, -1).T.tobytes())
    return data


def decode(raw: bytes, pipe: Pipeline, itemsize: int, nbytes: int, key: str) -> bytes:
    """The ``nbytes`` element bytes of one stored HDF5 chunk. Raises Corrupt."""
    if pipe.unknown:
        raise Corrupt(key, f"unsupported filter {pipe.unknown}")
    try:
        return _decode_once(raw, pipe, itemsize, nbytes, key)
    except Corrupt:
        if pipe.fletcher32 or not _fletcher32_ok(raw):
            raise
    return _decode_once(raw[:-FLETCHER32_SIZE], pipe, itemsize, nbytes, key)
