"""Decoding chunks exactly as an HDF5 file stores them (HSDS linked datasets,
LINDI external arrays), and what HDF5 filter JSON names.

Owns ``filter_classes`` (the ``H5Z_FILTER_*`` class of each entry of HDF5
filter JSON, a list of ``{class, id, name, ...}`` as HSDS stores it), ``Pipeline``
(what a dataset's filters mean for an HDF5 chunk) and ``decode``, which turns
the stored bytes of one HDF5 chunk into the raw element bytes of the whole
chunk. This differs from ``layouts.formats.hsds._chunks``: HSDS's own chunks are Blosc
frames, while an HDF5 file holds each filter's output as the HDF5 filter
plugin writes it.

The filters are undone in the fixed order HDF5 (as written by h5py) applies
them last to first, whatever order the JSON lists them in:

1. Fletcher32 (id 3): a 4-byte checksum after the data, verified and removed.
   ``hsload`` drops this filter from the JSON it sends to HSDS, so an
   unlisted checksum is accepted too, when the chunk does not decode without
   it and its last 4 bytes are the Fletcher32 of the rest.
2. One compressor: deflate (id 1, a zlib stream), Blosc (32001, a Blosc frame),
   Zstandard (32015, one zstd frame), LZ4 (32004, the HDF5 LZ4 plugin's
   framing: big-endian 8-byte total size, 4-byte block size, then each block
   as a 4-byte big-endian length and the LZ4 block, or the block itself when
   it did not compress), LZF (32000, h5py's filter: one LZF stream) or bzip2
   (307, the HDF5 bzip2 plugin's: one bzip2 stream). No compressor may produce
   more than the chunk's size (``layouts.hdf5._inflate``, ``layouts.hdf5._lzf``):
   the sizes headers declare are checked before decoding, streams stop one
   byte past it, and LZF decodes into a buffer of that size. h5py's LZF filter
   is optional: a chunk it cannot shrink is stored as it is, with a filter
   mask an HSDS chunk table does not keep, so an LZF chunk of exactly the
   chunk's size that is not an LZF stream of that size is taken as stored.
3. Byte shuffle (id 2) by the element size.

Anything else (szip, scale-offset, n-bit, bitshuffle, other plugins) makes
``Pipeline.unknown`` say so; every chunk read then fails, metadata still works.

``check_for_hdf5`` guards the chunks that are left to the HDF5 library itself
(``layouts.formats.refs._external`` reads some datasets through h5py): libhdf5's
deflate and bzip2 filters and h5py's LZF filter grow their buffers until the
stream ends, and szip, bitshuffle, n-bit and scale-offset allocate what the
chunk or the filter's parameters state. It undoes the compressors decoded here,
each capped, and checks the stated sizes of the others against the chunk's
size, so that a bomb is ``Corrupt`` before h5py sees it. A filter it can
neither decode nor read a stated size from (Blosc2, SZ, ZFP and every other
plugin) is refused, as is one whose output would feed another filter that
can grow it: libhdf5 would run them unbounded. ``stored_limit`` is the most
bytes a stored chunk of a given decoded size may have; a larger one is
refused before it is read.

Concurrency: pure functions over bytes, safe in any thread; ``decode`` is what
callers run in a worker thread for large chunks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from layouts.errors import Corrupt, FormatError
from layouts.hdf5._inflate import bunzip2, inflate, unblosc, unzstd
from layouts.hdf5._lzf import unlzf

FLETCHER32_SIZE = 4
_LZ4_HEADER = struct.Struct(">qi")
_LZ4_BLOCK = struct.Struct(">i")
_BITSHUFFLE_HEADER = struct.Struct(">qi")
_SZIP_HEADER = struct.Struct("<I")

#: HDF5 filter ids (H5Zpublic.h, and the ids registered with The HDF Group for plugins).
DEFLATE, SHUFFLE, FLETCHER32, SZIP, NBIT, SCALEOFFSET = 1, 2, 3, 4, 5, 6
BZIP2, LZF, BLOSC, LZ4, BITSHUFFLE, ZSTD = 307, 32000, 32001, 32004, 32008, 32015

_COMPRESSORS = {"H5Z_FILTER_DEFLATE": "deflate", "H5Z_FILTER_BLOSC": "blosc",
                "H5Z_FILTER_LZ4": "lz4", "H5Z_FILTER_ZSTD": "zstd", "H5Z_FILTER_LZF": "lzf",
                "H5Z_FILTER_BZIP2": "bzip2"}
_COMPRESSOR_IDS = {DEFLATE: "deflate", BLOSC: "blosc", LZ4: "lz4", ZSTD: "zstd", LZF: "lzf",
                   BZIP2: "bzip2"}
_CLASS_BY_ID = {0: "H5Z_FILTER_NONE", 1: "H5Z_FILTER_DEFLATE", 2: "H5Z_FILTER_SHUFFLE",
                3: "H5Z_FILTER_FLETCHER32", 5: "H5Z_FILTER_NBIT", 6: "H5Z_FILTER_SCALEOFFSET",
                307: "H5Z_FILTER_BZIP2", 32000: "H5Z_FILTER_LZF", 32001: "H5Z_FILTER_BLOSC",
                32003: "H5Z_FILTER_SNAPPY", 32004: "H5Z_FILTER_LZ4", 32005: "H5Z_FILTER_LZ4HC",
                32008: "H5Z_FILTER_BITSHUFFLE", 32015: "H5Z_FILTER_ZSTD"}
_KNOWN_CLASSES = frozenset(_CLASS_BY_ID.values())


def stored_limit(nbytes: int) -> int:
    """The most bytes a stored chunk that decodes to ``nbytes`` may have, whatever its
    filters: twice the size plus 4 KiB, far above the worst case of any compressor
    here (zlib adds under 1%, Blosc 16 bytes, LZ4 0.4% plus 20 bytes a block),
    a checksum and their headers."""
    return 2 * nbytes + 4096


def filter_classes(filters: Any) -> list[tuple[str | None, Mapping[str, Any]]]:
    """Each filter of HDF5 filter JSON (a list of ``{class, id, name, ...}``) with its
    ``H5Z_FILTER_*`` class: its ``class`` when that names a known filter, else the
    class of its numeric ``id``, else None. Shared by the HDF5 chunk reader here
    and the HSDS chunk reader (``layouts.formats.hsds._chunks``)."""
    if filters is None:
        return []
    if not isinstance(filters, list):
        raise FormatError("filters must be a list")
    out: list[tuple[str | None, Mapping[str, Any]]] = []
    for item in filters:
        if not isinstance(item, Mapping):
            raise FormatError(f"filter must be an object, got {item!r}")
        cls = item.get("class")
        if cls not in _KNOWN_CLASSES:
            fid = item.get("id")
            cls = _CLASS_BY_ID.get(fid) if isinstance(fid, int) and not isinstance(fid, bool) \
                else None
        out.append((cls, item))
    return out


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The HDF5 filters of one dataset, as far as decoding needs them."""

    fletcher32: bool = False
    compressor: str | None = None
    shuffle: bool = False
    #: Description of the first filter that cannot be undone, if any.
    unknown: str | None = None


def pipeline(filters: Any) -> Pipeline:
    """Interpret HDF5 filter JSON (a list of ``{class, id, name, ...}``)."""
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


def _unlz4(raw: bytes, limit: int, key: str) -> bytes:
    if len(raw) < _LZ4_HEADER.size:
        raise Corrupt(key, "too short for an HDF5 LZ4 header")
    total, block = _LZ4_HEADER.unpack_from(raw)
    if not 0 <= total <= limit or block <= 0:
        raise Corrupt(key, f"bad LZ4 header (total {total}, block {block} bytes, "
                      f"at most {limit} expected)")
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


_DECOMPRESS: dict[str, Callable[[bytes, int, str], bytes]] = {
    "deflate": inflate, "blosc": unblosc, "zstd": unzstd, "lz4": _unlz4, "lzf": unlzf,
    "bzip2": bunzip2}


def _unlzf_or_stored(data: bytes, nbytes: int, key: str) -> bytes:
    """An LZF chunk of ``nbytes`` stored bytes: the stream decoded, if it is one of
    ``nbytes``, else the bytes as stored (h5py's optional filter gave up on them)."""
    try:
        decoded = unlzf(data, nbytes, key)
    except Corrupt:
        return data
    return decoded if len(decoded) == nbytes else data


def _decode_once(raw: bytes, pipe: Pipeline, itemsize: int, nbytes: int, key: str) -> bytes:
    data = raw
    if pipe.fletcher32:
        data = _fletcher32_strip(data, key)
    if pipe.compressor == "lzf" and len(data) == nbytes:
        data = _unlzf_or_stored(data, nbytes, key)
    elif pipe.compressor is not None:
        data = _DECOMPRESS[pipe.compressor](data, nbytes, key)
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


def _keeps_size(code: int, values: Sequence[int]) -> bool:
    """True for an HDF5 filter whose output has the size of its input: shuffle, and
    bitshuffle without compression (its cd_values[4] is the compressor, 0 for none)."""
    return code == SHUFFLE or (code == BITSHUFFLE and not (len(values) >= 5 and values[4]))


def _never_grows(code: int, values: Sequence[int]) -> bool:
    """True for an HDF5 filter whose output is never larger than its input."""
    return code == FLETCHER32 or _keeps_size(code, values)


def _stated_size(code: int, values: Sequence[int], data: bytes, key: str) -> int | None:
    """What the HDF5 filter ``code`` will allocate to undo itself on ``data``, from its
    parameters or header, when it says (the filters ``check_for_hdf5`` cannot decode)."""
    if code == SZIP:  # H5Z_filter_szip: the decoded size, 4 bytes little-endian, first
        if len(data) < _SZIP_HEADER.size:
            raise Corrupt(key, "szip chunk shorter than its header")
        return int(_SZIP_HEADER.unpack_from(data)[0])
    if code in (NBIT, SCALEOFFSET) and len(values) >= 5:
        return values[2] * values[4]  # elements times element size
    if code == BITSHUFFLE and len(values) >= 5 and values[4]:
        if len(data) < _BITSHUFFLE_HEADER.size:
            raise Corrupt(key, "bitshuffle chunk shorter than its header")
        return int(_BITSHUFFLE_HEADER.unpack_from(data)[0])  # big-endian total bytes
    return None


def check_for_hdf5(raw: bytes, filters: Sequence[tuple[int, Sequence[int]]], limit: int,
                   key: str) -> None:
    """Raise Corrupt unless libhdf5 can undo ``filters`` on the stored chunk ``raw``
    without making more than ``limit`` bytes (the chunk's size in the file).

    ``filters`` are (filter id, cd_values) in pipeline (encoding) order, those the
    chunk's filter mask skips already left out. They are undone last to first:
    Fletcher32 is stripped, shuffle and uncompressed bitshuffle keep the size,
    deflate, Blosc, zstd, LZ4, LZF and bzip2 are decoded here, each capped (at
    ``limit`` when only size-keeping filters remain, else at
    ``stored_limit(limit)``, as the output is another filter's stored form).
    Szip, n-bit, scale-offset and compressed bitshuffle are checked by the size
    they state, which their libhdf5 filter allocates; that ends the check, so
    only filters that never grow their input may be left to undo after them.
    Any other filter is refused: nothing here says how much libhdf5 would let
    it make.
    """
    data = raw
    for pos in range(len(filters) - 1, -1, -1):
        code, values = filters[pos]
        sized = all(_keeps_size(*earlier) for earlier in filters[:pos])
        cap = limit if sized else stored_limit(limit)
        if code == FLETCHER32:
            if len(data) < FLETCHER32_SIZE:
                raise Corrupt(key, "chunk is shorter than its Fletcher32 checksum")
            data = data[:-FLETCHER32_SIZE]
        elif _keeps_size(code, values):
            continue
        elif code in _COMPRESSOR_IDS:
            data = _DECOMPRESS[_COMPRESSOR_IDS[code]](data, cap, key)
        else:
            stated = _stated_size(code, values, data, key)
            if stated is None:
                raise Corrupt(key, f"filter {code} cannot be held to the chunk's size before "
                                   f"libhdf5 runs it")
            if stated > cap:
                raise Corrupt(key, f"filter {code} states {stated} bytes, more than the "
                                   f"chunk's {cap}")
            later = [undone for undone, params in filters[:pos]
                     if not _never_grows(undone, params)]
            if later:
                raise Corrupt(key, f"filter {later[-1]} would undo filter {code}'s output "
                                   f"unchecked")
            return
