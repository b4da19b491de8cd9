"""Decoding the chunks of a reference file into chunk files (docs/CONTRACT.md, "Chunk files").

Owns the codec pipeline of one dataset (its ``.zarray`` filters and
compressor, through numcodecs) and ``decode_chunk``, which undoes it and
re-encodes what remains in the form a chunk file must have:

* fixed-size elements (``Kind.RAW``): the decoded bytes themselves, exactly
  ``prod(chunks) * itemsize`` of them, C order (a Fortran-order array is
  transposed), structured types repacked without padding as HSDS stores them.
  An unfiltered chunk that is short is padded with the fill value, as LINDI
  pads the last chunk it cuts from a large contiguous dataset.
* a NumPy unicode array (``Kind.TEXT``: LINDI's scalar strings, ``<U12``):
  numcodecs ``VLenUTF8``.
* LINDI's ``json2`` object arrays (``[e0, e1, ..., "|O", [shape]]``, nested
  lists in C order): strings -> ``VLenUTF8`` (``Kind.JSON_TEXT``);
  ``{"_REFERENCE": {"path": ...}}`` -> the path, UTF-8, NUL-padded to the
  reference width (``Kind.JSON_REF``); compound rows -> packed structured
  bytes, reference fields likewise (``Kind.JSON_COMPOUND``).
* numcodecs ``vlen-utf8``/``vlen-bytes``/``vlen-array`` (kerchunk,
  ``Kind.VLEN``): checked and re-encoded with the same codec (``VLenBytes``
  and ``VLenUTF8`` share one byte layout, which is the chunk-file one).

Byte codecs are undone in reverse encoding order: compressor, then filters
last to first. Known ids: ``BYTE_CODECS`` and ``OBJECT_CODECS``. An unknown
codec is not an error of the metadata: ``Codecs.problem`` says why chunks
cannot be read, and only chunk reads fail. That holds for every numcodecs
codec not listed (``delta``, ``fixedscaleoffset``, ``quantize``, ``astype``,
``packbits``, ``categorize``, ``bitround``, imagecodecs' ``lzf``...): none is
run, bounded or not. A fletcher32 checksum that does
not match, or any codec failure, raises ``Corrupt`` naming the chunk's key.

No codec may produce more than the chunk can hold (``decode_bytes``): its
size for fixed-size kinds, ``layouts.hdf5._inflate.MAX_VLEN_CHUNK_BYTES`` for the
others, whose encoded size nothing states. Compressors are undone by
``layouts.hdf5._inflate`` (bounded: zlib, gzip, bz2 and lzma streams with
``max_length``, an lzma decoder's own memory with a limit, Blosc, zstd and LZ4
by the size their headers state), not by numcodecs' unbounded ``decode``; the
item count of ``vlen-*`` data is checked before numcodecs allocates for it.
Residual risk: a ``json2`` chunk within that cap is parsed by ``json.loads``,
whose Python objects can take several times the text's size.

Pure synchronous code; codec instances are stateless for decoding, so a
``ChunkSpec`` may be used from any trio task or worker thread at once.
"""

from __future__ import annotations

import enum
import json
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np
from numcodecs.abc import Codec

from layouts.errors import Corrupt, FormatError
from layouts.formats.refs._types import nested_items, reference_path
from layouts.hdf5 import (
    MAX_VLEN_CHUNK_BYTES,
    bunzip2,
    gunzip,
    inflate,
    unblosc,
    unlz4,
    unxz,
    unzstd,
)

#: Codecs on bytes that are undone here (numcodecs ids).
BYTE_CODECS = frozenset({"blosc", "zlib", "gzip", "bz2", "lzma", "zstd", "lz4", "shuffle",
                         "fletcher32"})
#: Codecs that turn an object array into bytes; only as the first filter of ``|O`` data.
OBJECT_CODECS = frozenset({"json2", "vlen-utf8", "vlen-bytes", "vlen-array"})

_VLEN_UTF8 = numcodecs.VLenUTF8()
#: Bytes a numcodecs ``fletcher32`` checksum adds.
FLETCHER32_SIZE = 4
#: numcodecs ``vlen-*`` data starts with its item count, a little-endian uint32.
_ITEM_COUNT = struct.Struct("<I")
#: A JSON object that is a LINDI reference: a bare quote only occurs outside strings.
_REFERENCE_RE = re.compile(rb'\{\s*"_REFERENCE"\s*:')


class Kind(enum.Enum):
    """How decoded chunk bytes become a chunk file (see module docstring)."""

    RAW = "raw"
    TEXT = "text"
    JSON_TEXT = "json-text"
    JSON_REF = "json-ref"
    JSON_COMPOUND = "json-compound"
    VLEN = "vlen"


@dataclass(frozen=True, slots=True)
class Codecs:
    """A dataset's codec pipeline.

    ``byte_codecs`` are in decoding order. ``object_codec`` is the object
    codec (the first filter) of ``|O`` data, ``object_id`` its id even when it
    cannot be built. ``problem`` says why no chunk can be decoded, if so.
    """

    byte_codecs: tuple[Codec, ...] = ()
    object_codec: Codec | None = None
    object_id: str | None = None
    problem: str | None = None


def codecs(configs: Sequence[Mapping[str, Any]]) -> Codecs:
    """The pipeline of codec configs in encoding order (filters, then compressor)."""
    byte_codecs: list[Codec] = []
    object_codec = None
    object_id = None
    problem = None
    for position, config in enumerate(configs):
        cid = str(config["id"])
        if cid in OBJECT_CODECS:
            if position:
                problem = problem or f"object codec {cid!r} after another codec"
                continue
            object_id = cid
        elif cid not in BYTE_CODECS:
            problem = problem or f"unsupported codec {cid!r}"
            continue
        try:
            codec = numcodecs.get_codec(dict(config))
        except (TypeError, ValueError, KeyError) as exc:
            problem = problem or f"bad codec config {dict(config)!r}: {exc}"
            continue
        if cid in OBJECT_CODECS:
            object_codec = codec
        else:
            byte_codecs.append(codec)
    return Codecs(tuple(reversed(byte_codecs)), object_codec, object_id, problem)


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """Everything needed to turn one dataset's stored chunks into chunk files.

    ``chunks`` is the stored chunk shape (``(1,)`` for a LINDI scalar, ``()``
    for a 0-d array). ``stored`` is the ``.zarray`` dtype, ``out`` the chunk
    file's element dtype (fixed-size kinds; ``object`` otherwise). ``fill`` is
    one element of the fill value in ``out``.
    """

    kind: Kind
    chunks: tuple[int, ...]
    stored: np.dtype[Any]
    out: np.dtype[Any]
    codecs: Codecs
    fill: bytes = b""
    fortran: bool = False

    @property
    def elements(self) -> int:
        return math.prod(self.chunks)

    @property
    def nbytes(self) -> int | None:
        """Size of a chunk file for fixed-size kinds, else None."""
        if self.kind in (Kind.RAW, Kind.JSON_REF, Kind.JSON_COMPOUND):
            return self.elements * self.out.itemsize
        return None


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, np.ndarray):
        return data.tobytes()
    return bytes(data)


def _stage_limits(pipeline: Codecs, limit: int) -> list[int]:
    """The most bytes each byte codec's decoding may produce when the last one's may
    produce ``limit``: a Fletcher32 still to be undone adds its 4 bytes."""
    limits = []
    extra = 0
    for codec in reversed(pipeline.byte_codecs):
        limits.append(limit + extra)
        if codec.codec_id == "fletcher32":
            extra += FLETCHER32_SIZE
    return limits[::-1]


def _decode_one(codec: Codec, data: bytes, limit: int, sized: bool, key: str) -> bytes:
    """Undo one byte codec, never producing more than ``limit`` bytes (``sized``: the
    output should be exactly that long). Raises Corrupt."""
    cid = codec.codec_id
    if cid == "zlib":
        return inflate(data, limit, key, sized=sized)
    if cid == "gzip":
        return gunzip(data, limit, key)
    if cid == "bz2":
        return bunzip2(data, limit, key)
    if cid == "lzma":
        return unxz(data, limit, key, codec.format)
    if cid == "blosc":
        return unblosc(data, limit, key)
    if cid == "zstd":
        return unzstd(data, limit, key)
    if cid == "lz4":
        return unlz4(data, limit, key)
    try:  # shuffle and fletcher32 never make more bytes than they are given
        return _as_bytes(codec.decode(data))
    except Exception as exc:  # numcodecs raises RuntimeError, ValueError, TypeError...
        if cid == "fletcher32":
            raise Corrupt(key, f"fletcher32 checksum does not match: {exc}") from exc
        raise Corrupt(key, f"{cid} decoding failed: {exc}") from exc


def decode_bytes(raw: bytes, pipeline: Codecs, key: str, limit: int | None = None) -> bytes:
    """Undo the byte codecs of a stored chunk. Raises Corrupt.

    ``limit`` is the chunk's decoded size when it is known (fixed-size elements);
    otherwise ``MAX_VLEN_CHUNK_BYTES`` caps it. No codec is let produce more than
    that (plus the checksums still to strip): ``layouts.hdf5._inflate`` refuses a Blosc,
    zstd or LZ4 header stating more before anything is allocated, and stops a
    zlib or gzip stream one byte past it.
    """
    sized = limit is not None
    cap = MAX_VLEN_CHUNK_BYTES if limit is None else limit
    data = raw
    for codec, stage in zip(pipeline.byte_codecs, _stage_limits(pipeline, cap), strict=True):
        data = _decode_one(codec, data, stage, sized, key)
    return data


def has_references(data: bytes) -> bool:
    """True if decoded ``json2`` bytes hold a LINDI reference object."""
    return _REFERENCE_RE.search(data) is not None


def _json_elements(data: bytes, spec: ChunkSpec) -> list[Any]:
    doc = json.loads(data.decode("utf-8"))
    if not isinstance(doc, list) or len(doc) < 2 or not isinstance(doc[-1], list):
        raise FormatError("not a numcodecs JSON array")
    if tuple(doc[-1]) != spec.chunks:
        raise FormatError(f"JSON array has shape {doc[-1]}, the chunk shape is "
                          f"{list(spec.chunks)}")
    return nested_items(doc[:-2], spec.chunks)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FormatError(f"string expected, got {str(value)[:80]}")
    return value


def _fixed_field(value: Any, dtype: np.dtype[Any]) -> Any:
    """A JSON element for a fixed-size (field) dtype: strings and references as bytes."""
    if dtype.kind != "S":
        return value
    if isinstance(value, str):
        raw = value.encode("utf-8")
    else:
        path = reference_path(value)
        raw = b"" if path is None else path.encode("utf-8")
    if len(raw) > dtype.itemsize:
        raise FormatError(f"{len(raw)}-byte value {raw[:60]!r} does not fit {dtype.str}")
    return raw


def _packed(elements: list[Any], spec: ChunkSpec) -> bytes:
    out = spec.out
    if spec.kind is Kind.JSON_REF:
        rows: list[Any] = [_fixed_field(v, out) for v in elements]
    else:
        assert out.names is not None
        kinds = [out.fields[name][0] for name in out.names]
        rows = []
        for row in elements:
            if not isinstance(row, list) or len(row) != len(kinds):
                raise FormatError(f"compound row needs {len(kinds)} fields, got {str(row)[:80]}")
            rows.append(tuple(_fixed_field(v, k) for v, k in zip(row, kinds, strict=True)))
    try:
        return np.array(rows, dtype=out).tobytes()
    except (TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"values do not fit {out}: {exc}") from exc


def _raw(data: bytes, spec: ChunkSpec, key: str) -> bytes:
    expected = spec.elements * spec.stored.itemsize
    if (len(data) < expected and not spec.codecs.byte_codecs and spec.stored.kind in "iuf"
            and len(data) % spec.stored.itemsize == 0):
        data += spec.fill * ((expected - len(data)) // spec.stored.itemsize)
    if len(data) != expected:
        raise Corrupt(key, f"chunk decodes to {len(data)} bytes, expected {expected}")
    if not spec.fortran and spec.stored == spec.out:
        return data
    arr = np.frombuffer(data, dtype=spec.stored).reshape(spec.chunks,
                                                         order="F" if spec.fortran else "C")
    if spec.stored.names is not None and spec.stored != spec.out:
        arr = arr.astype(spec.out)
    return np.ascontiguousarray(arr).tobytes()


def _vlen(data: bytes, spec: ChunkSpec) -> bytes:
    codec = spec.codecs.object_codec
    assert codec is not None
    # numcodecs allocates an object array of the stated count before reading a
    # single item: 4 GiB of item count would be 32 GiB of pointers.
    if len(data) < _ITEM_COUNT.size:
        raise FormatError("too short for a vlen item count")
    (count,) = _ITEM_COUNT.unpack_from(data)
    if count != spec.elements:
        raise FormatError(f"{count} items in a chunk of {spec.elements}")
    items = np.asarray(codec.decode(data), dtype=object).reshape(-1)
    if items.size != spec.elements:
        raise FormatError(f"{items.size} items in a chunk of {spec.elements}")
    return _as_bytes(codec.encode(items))


def decode_chunk(raw: bytes, spec: ChunkSpec, key: str) -> bytes:
    """A stored chunk as chunk-file bytes (docs/CONTRACT.md, "Chunk files"). Raises Corrupt."""
    if spec.codecs.problem:
        raise Corrupt(key, spec.codecs.problem)
    limit = spec.elements * spec.stored.itemsize if spec.kind in (Kind.RAW, Kind.TEXT) \
        else None
    data = decode_bytes(raw, spec.codecs, key, limit)
    if spec.kind is Kind.RAW:
        return _raw(data, spec, key)
    try:
        if spec.kind is Kind.TEXT:
            expected = spec.elements * spec.stored.itemsize
            if len(data) != expected:
                raise FormatError(f"{len(data)} bytes, expected {expected}")
            texts = np.frombuffer(data, dtype=spec.stored).astype(object)
            return _as_bytes(_VLEN_UTF8.encode(texts))
        if spec.kind is Kind.VLEN:
            return _vlen(data, spec)
        elements = _json_elements(data, spec)
        if spec.kind is Kind.JSON_TEXT:
            texts = np.array([_text(v) for v in elements], dtype=object)
            return _as_bytes(_VLEN_UTF8.encode(texts))
        return _packed(elements, spec)
    except (FormatError, UnicodeDecodeError, ValueError, TypeError, RecursionError) as exc:
        raise Corrupt(key, f"bad {spec.kind.value} chunk: {exc}") from exc
