"""Decompression bombs: no chunk decoder makes more than the chunk can hold.

Each codec path the mount decodes with is fed a real bomb (a zlib or gzip
stream of hundreds of MiB of zeros, Blosc, zstd and LZ4 headers stating
gigabytes, a zstd frame whose blocks run past the size it declares, a
``vlen-utf8`` item count of tens of millions, an HDF5 chunk that inflates to
512 MiB) through the same functions the mount calls: ``layouts.hdf5._inflate``,
``hsds_chunks.decode_chunk``, ``lindi_codecs.decode_chunk``,
``h5filters.decode`` and ``check_for_hdf5``, the linked HSDS store and the
LINDI external-array store (both its h5py path and its linked path). Each must
be ``Corrupt`` with the memory it used (tracemalloc peak, or the RSS high-water
mark of a fresh subprocess for libhdf5) far below the bomb's size. Valid
chunks at exactly their size, edge chunks and whole HDF5 filter pipelines
(written by HDF5 itself) must still decode byte for byte.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import lzma
import math
import struct
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numcodecs
import numpy as np
import pytest
import trio

from layouts.formats.hsds import _chunks as hsds_chunks
from layouts.formats.hsds._chunks import ChunkSpec, decode_chunk, filter_plan
from layouts.formats.hsds._linked import linked_store
from layouts.formats.refs import _codecs as lindi_codecs
from layouts.formats.refs._catalog import DatasetShape
from layouts.formats.refs._codecs import Kind, codecs
from layouts.formats.refs._external import H5ExternalArrays
from layouts.hdf5._filters import (
    BITSHUFFLE,
    BZIP2,
    DEFLATE,
    FLETCHER32,
    LZF,
    NBIT,
    SCALEOFFSET,
    SHUFFLE,
    SZIP,
    Pipeline,
    check_for_hdf5,
    decode,
    pipeline,
    stored_limit,
)
from layouts.hdf5._inflate import (
    bunzip2,
    gunzip,
    inflate,
    unblosc,
    unlz4,
    unxz,
    unzstd,
    zstd_content_size,
)
from layouts.hdf5._lzf import unlzf
from layouts.hdf5._types import element_type, parse_type
from layouts.storage import Store
from mountd.errors import Corrupt, StorageError
from mountd.io.local import LocalStore

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
#: What a bomb inflates to when nothing stops it.
BOMB = 256 * MiB
#: The chunk size the bombs are decoded against.
CHUNK = MiB
#: Most memory a refused bomb may cost: a few chunk sizes, nowhere near BOMB.
BOUND = 4 * CHUNK + MiB
#: What the bombs of the tests outside the slow tier inflate to: 12 times BOUND.
SMALL_BOMB = 64 * MiB
LOCAL = LocalStore("/")

GZIP = [{"class": "H5Z_FILTER_DEFLATE", "id": 1}]
BLOSC = [{"class": "H5Z_FILTER_BLOSC", "id": 32001}]
BITSHUFFLE_JSON = {"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "bitshuffle"}


def measured(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(what ``fn`` returned or raised, the peak of memory it allocated)."""
    tracemalloc.start()
    try:
        try:
            result = fn()
        except Exception as exc:  # the caller asserts what it is
            result = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def refused(fn: Callable[[], Any], match: str = "", bound: int = BOUND) -> Corrupt:
    """Assert ``fn`` raises Corrupt (matching ``match``) using less than ``bound`` bytes."""
    result, peak = measured(fn)
    assert isinstance(result, Corrupt), result
    assert match in str(result), result
    assert peak < bound, f"{peak} bytes allocated refusing it"
    return result


@functools.cache
def zlib_bomb(size: int = BOMB, wbits: int = zlib.MAX_WBITS) -> bytes:
    """A zlib (or, with wbits 31, gzip) stream of ``size`` zero bytes."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(16 * MiB)
    parts = [squeeze.compress(block) for _ in range(size // len(block))]
    return b"".join(parts) + squeeze.flush()


def lzf_stream(data: bytes) -> bytes:
    """``data`` as h5py's lzf filter stores it (one chunk)."""
    with h5py.File(io.BytesIO(), "w") as f:
        ds = f.create_dataset("z", data=np.frombuffer(data, "u1"), chunks=(len(data),),
                              compression="lzf")
        mask, raw = ds.id.read_direct_chunk((0,))
    assert mask == 0
    return bytes(raw)


@functools.cache
def lzf_bomb(size: int = SMALL_BOMB) -> bytes:
    """An LZF stream of ``size`` zero bytes."""
    return lzf_stream(bytes(size))


@functools.cache
def bz2_bomb(size: int = SMALL_BOMB) -> bytes:
    """A bzip2 stream of ``size`` zero bytes."""
    squeeze = bz2.BZ2Compressor(9)
    block = bytes(16 * MiB)
    return b"".join(squeeze.compress(block) for _ in range(size // len(block))) + \
        squeeze.flush()


@functools.cache
def xz_bomb(size: int = SMALL_BOMB, fmt: int = lzma.FORMAT_XZ) -> bytes:
    """An xz (or lzma-alone) stream of ``size`` zero bytes."""
    squeeze = lzma.LZMACompressor(fmt, preset=0)
    block = bytes(16 * MiB)
    return b"".join(squeeze.compress(block) for _ in range(size // len(block))) + \
        squeeze.flush()


def zstd_frame(blocks: int, declared: int | None, block: int = 128 * 1024) -> bytes:
    """A zstd frame of ``blocks`` RLE blocks of ``block`` zero bytes each (4 bytes of
    input per block), declaring ``declared`` as its content size (None: no size)."""
    # descriptor: an 8-byte content size or none; window descriptor 0x58: 2 MiB
    descriptor = 0x00 if declared is None else 0xC0
    size = b"" if declared is None else struct.pack("<Q", declared)
    out = bytearray(struct.pack("<I", 0xFD2FB528) + bytes([descriptor, 0x58]) + size)
    for i in range(blocks):
        header = (i == blocks - 1) | (1 << 1) | (block << 3)  # last flag, RLE, size
        out += header.to_bytes(3, "little") + b"\0"
    return bytes(out)


def blosc_claiming(nbytes: int) -> bytes:
    """A real Blosc frame whose header states ``nbytes`` decoded bytes."""
    frame = bytearray(numcodecs.blosc.compress(bytes(4096), b"lz4", 5, 1, 1))
    frame[4:8] = struct.pack("<I", nbytes)
    return bytes(frame)


def lz4_claiming(nbytes: int) -> bytes:
    """numcodecs LZ4 data whose size prefix states ``nbytes``."""
    return struct.pack("<I", nbytes) + bytes(numcodecs.LZ4().encode(bytes(4096)))[4:]


# --------------------------------------------------------------------------- layouts.hdf5._inflate


@pytest.mark.slow
def test_zlib_and_gzip_bombs_stop_at_the_limit() -> None:
    bomb = zlib_bomb()
    assert len(bomb) < BOMB // 500
    refused(lambda: inflate(bomb, CHUNK, "k"), "more than the chunk's")
    refused(lambda: inflate(bomb, CHUNK, "k", sized=False), "more than the chunk's")
    gz = zlib_bomb(BOMB, 31)
    refused(lambda: gunzip(gz, CHUNK, "k"), "more than the chunk's")
    # a second member cannot add to the first beyond the limit either
    small = gzip.compress(bytes(CHUNK // 2))
    refused(lambda: gunzip(small + small + small, CHUNK, "k"), "more than")


def test_header_bombs_are_refused_before_allocating() -> None:
    refused(lambda: unblosc(blosc_claiming((1 << 31) - 64), CHUNK, "k"), "Blosc frame of")
    refused(lambda: unlz4(lz4_claiming((1 << 32) - 1), CHUNK, "k"), "states 4294967295")
    ten_gib = 10 << 30
    refused(lambda: unzstd(zstd_frame(4, ten_gib), CHUNK, "k"), f"declares {ten_gib}")
    refused(lambda: unzstd(zstd_frame(4, None), CHUNK, "k"), "declares None")
    # declares the limit, holds 80 blocks of 128 KiB: libzstd stops at the declared size
    refused(lambda: unzstd(zstd_frame(80, CHUNK), CHUNK, "k"), "zstd decompression failed")
    # c-blosc trusts cbytes: a frame cut short would be read past its end
    frame = bytes(numcodecs.blosc.compress(bytes(CHUNK), b"lz4", 5, 1, 1))
    refused(lambda: unblosc(frame[:-3], CHUNK, "k"), "of 1048576 bytes or fewer")


def test_valid_streams_at_exactly_the_limit() -> None:
    data = np.random.default_rng(1).integers(0, 50, CHUNK, dtype=np.uint8).tobytes()
    assert inflate(zlib.compress(data), CHUNK, "k") == data
    assert inflate(zlib.compress(data), CHUNK, "k", sized=False) == data
    assert inflate(zlib.compress(b""), 0, "k") == b""
    two = gzip.compress(data[:1000]) + b"\0\0" + gzip.compress(data[1000:]) + b"\0"
    assert gunzip(two, CHUNK, "k") == gzip.decompress(two) == data
    assert gunzip(b"", 0, "k") == b""
    assert unblosc(bytes(numcodecs.Blosc("zstd").encode(data)), CHUNK, "k") == data
    zst = bytes(numcodecs.Zstd().encode(data))
    assert zstd_content_size(zst) == CHUNK
    assert unzstd(zst, CHUNK, "k") == data
    assert unzstd(zstd_frame(8, CHUNK), CHUNK, "k") == bytes(CHUNK)
    assert unlz4(bytes(numcodecs.LZ4().encode(data)), CHUNK, "k") == data
    with pytest.raises(Corrupt, match="more than"):
        inflate(zlib.compress(data), CHUNK - 1, "k")
    with pytest.raises(Corrupt, match="truncated"):
        gunzip(gzip.compress(data)[:-20], CHUNK, "k")


def test_stream_bombs_stop_at_the_limit() -> None:
    """LZF (as h5py's filter writes it), bzip2, xz and lzma-alone streams of 64 MiB of
    zeros, each made by its own compressor, stop at the limit."""
    bombs = {"lzf": (unlzf, lzf_bomb(), "LZF stream holds more than the chunk's"),
             "bzip2": (bunzip2, bz2_bomb(), "bzip2 data holds more than the chunk's"),
             "xz": (unxz, xz_bomb(), "lzma data holds more than the chunk's"),
             "alone": (functools.partial(unxz, fmt=lzma.FORMAT_ALONE),
                       xz_bomb(fmt=lzma.FORMAT_ALONE), "lzma data holds more than")}
    for name, (undo, bomb, match) in bombs.items():
        assert len(bomb) < SMALL_BOMB // 80, name
        refused(lambda undo=undo, bomb=bomb, name=name: undo(bomb, CHUNK, name), match)
    # further streams cannot add to the first beyond the limit
    half = bz2.compress(bytes(CHUNK // 2))
    refused(lambda: bunzip2(half * 3, CHUNK, "k"), "bzip2 data holds more")
    half = lzma.compress(bytes(CHUNK // 2), preset=0)  # a 256 KiB dictionary
    refused(lambda: unxz(half * 3, CHUNK, "k"), "lzma data holds more")


def test_lzma_dictionary_is_held_to_the_memory_limit() -> None:
    """liblzma allocates the dictionary a header states before it decodes a byte: a
    1 GiB one is refused having allocated nothing like it."""
    stream = bytearray(lzma.compress(bytes(1000), format=lzma.FORMAT_ALONE))
    stream[1:5] = struct.pack("<I", 1 << 30)
    refused(lambda: unxz(bytes(stream), CHUNK, "k", lzma.FORMAT_ALONE), "Memory usage limit")
    with pytest.raises(Corrupt, match="cannot be held to a memory limit"):
        unxz(lzma.compress(b"x", format=lzma.FORMAT_RAW,
                           filters=[{"id": lzma.FILTER_LZMA2}]), CHUNK, "k", lzma.FORMAT_RAW)


def test_valid_streams_of_the_other_codecs_at_exactly_the_limit() -> None:
    data = np.random.default_rng(3).integers(0, 50, CHUNK, dtype=np.uint8).tobytes()
    assert bunzip2(bz2.compress(data), CHUNK, "k") == data
    two = bz2.compress(data[:1000]) + bz2.compress(data[1000:])
    assert bunzip2(two, CHUNK, "k") == bz2.decompress(two) == data
    # preset 9: a 64 MiB dictionary, within LZMA_MEMLIMIT
    for fmt in (lzma.FORMAT_XZ, lzma.FORMAT_ALONE):
        packed = lzma.compress(data, format=fmt, preset=9)
        assert unxz(packed, CHUNK, "k", fmt) == lzma.decompress(packed) == data
    with pytest.raises(Corrupt, match="truncated"):
        bunzip2(bz2.compress(data)[:-20], CHUNK, "k")
    with pytest.raises(Corrupt, match="lzma decompression failed"):
        unxz(b"not an xz stream at all", CHUNK, "k")
    data = (np.arange(CHUNK // 4, dtype="<i4") % 1000 * 7).tobytes()  # LZF shrinks this
    packed = lzf_stream(data)
    assert unlzf(packed, CHUNK, "k") == data
    with pytest.raises(Corrupt, match="not a valid LZF stream"):
        unlzf(packed[:-1], CHUNK, "k")
    with pytest.raises(Corrupt, match="more than the chunk's 1048575"):
        unlzf(packed, CHUNK - 1, "k")
    with pytest.raises(Corrupt, match="empty LZF stream"):
        unlzf(b"", CHUNK, "k")


# --------------------------------------------------------------------------- HSDS chunks


def hsds_spec(tj: Any, chunks: tuple[int, ...], filters: list[Any] | None) -> ChunkSpec:
    t = parse_type(tj)
    return ChunkSpec(htype=t, etype=element_type(tj, t), chunks=chunks,
                     plan=filter_plan(filters))


@pytest.mark.slow
def test_hsds_chunk_bombs(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = zlib_bomb()
    spec = hsds_spec("H5T_STD_U8LE", (CHUNK,), GZIP)
    refused(lambda: decode_chunk(bomb, spec, "k"), "more than the chunk's")
    refused(lambda: decode_chunk(blosc_claiming((1 << 31) - 64), spec, "k"), "holds 2147483584")
    # bitshuffle: the Blosc frame holds the stream, which may exceed the chunk a little
    spec = hsds_spec("H5T_STD_U8LE", (CHUNK,), [BITSHUFFLE_JSON, *BLOSC])
    refused(lambda: decode_chunk(blosc_claiming(1 << 30), spec, "k"), "more than the chunk's")
    # variable-length chunks: capped at MAX_VLEN_CHUNK_BYTES (here made 1 MiB)
    monkeypatch.setattr(hsds_chunks, "MAX_VLEN_CHUNK_BYTES", CHUNK)
    vlen = {"class": "H5T_STRING", "charSet": "H5T_CSET_UTF8", "length": "H5T_VARIABLE"}
    spec = hsds_spec(vlen, (10,), GZIP)
    refused(lambda: decode_chunk(bomb, spec, "k"), "more than the chunk's")
    refused(lambda: decode_chunk(blosc_claiming(CHUNK + 1), spec, "k"),
            "more than the chunk's 1048576")


def test_hsds_valid_chunks_still_decode() -> None:
    data = np.arange(CHUNK // 4, dtype="<i4")
    spec = hsds_spec("H5T_STD_I32LE", (CHUNK // 4,), [{"class": "H5Z_FILTER_SHUFFLE", "id": 2},
                                                      *GZIP])
    frame = bytes(numcodecs.Blosc(cname="zlib", shuffle=1).encode(data.tobytes()))
    assert decode_chunk(frame, spec, "k") == data.tobytes()
    legacy = zlib.compress(bytes(numcodecs.Shuffle(4).encode(data.tobytes())))
    assert decode_chunk(legacy, spec, "k") == data.tobytes()
    # a zlib stream one byte too long for the chunk: stopped, and not raw-sized
    with pytest.raises(Corrupt, match="more than"):
        decode_chunk(zlib.compress(data.tobytes() + b"x"), spec, "k")
    bitshuffle = pytest.importorskip("bitshuffle")
    small = np.arange(3000, dtype="<i4")
    stream = (12000).to_bytes(8, "big") + (2048 * 4).to_bytes(4, "big") + \
        bitshuffle.compress_lz4(small, 2048).tobytes()
    spec = hsds_spec("H5T_STD_I32LE", (3000,), [BITSHUFFLE_JSON, *BLOSC])
    assert decode_chunk(bytes(numcodecs.Blosc(cname="lz4").encode(stream)), spec, "k") == \
        small.tobytes()


# --------------------------------------------------------------------------- LINDI codecs


def lindi_spec(configs: list[dict[str, Any]], kind: Kind = Kind.RAW,
               chunks: tuple[int, ...] = (CHUNK // 4,),
               dtype: str = "<i4") -> lindi_codecs.ChunkSpec:
    stored = np.dtype(dtype)
    return lindi_codecs.ChunkSpec(kind, chunks, stored, stored, codecs(configs),
                                  bytes(stored.itemsize))


@pytest.mark.slow
def test_lindi_codec_bombs(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = zlib_bomb()
    decode_lindi = lindi_codecs.decode_chunk
    cases = {
        "zlib": ([{"id": "zlib"}], zlib_bomb(), "more than the chunk's"),
        "gzip": ([{"id": "gzip"}], zlib_bomb(BOMB, 31), "more than the chunk's"),
        "blosc": ([{"id": "blosc"}], blosc_claiming((1 << 31) - 64), "Blosc frame of"),
        "zstd": ([{"id": "zstd"}], zstd_frame(4, 10 << 30), "declares 10737418240"),
        "zstd-runs-on": ([{"id": "zstd"}], zstd_frame(80, CHUNK), "zstd decompression failed"),
        "lz4": ([{"id": "lz4"}], lz4_claiming((1 << 32) - 1), "states 4294967295"),
        "bz2": ([{"id": "bz2"}], bz2_bomb(), "more than the chunk's"),
        "lzma": ([{"id": "lzma"}], xz_bomb(), "more than the chunk's"),
        "lzma-alone": ([{"id": "lzma", "format": lzma.FORMAT_ALONE}],
                       xz_bomb(fmt=lzma.FORMAT_ALONE), "more than the chunk's"),
        "shuffle+zlib": ([{"id": "shuffle", "elementsize": 4}, {"id": "zlib"}], zlib_bomb(),
                         "more than"),
        "fletcher32+zlib": ([{"id": "fletcher32"}, {"id": "zlib"}], zlib_bomb(), "more than"),
    }
    for name, (configs, raw, match) in cases.items():
        spec = lindi_spec(configs)
        err = refused(lambda raw=raw, spec=spec: decode_lindi(raw, spec, "k"), match)
        assert err.key == "k", name
    # vlen-utf8: numcodecs would allocate an object array of the stated item count
    spec = lindi_spec([{"id": "vlen-utf8"}], Kind.VLEN, (4,), "O")
    counted = struct.pack("<I", 50_000_000) + struct.pack("<I", 1) + b"a"
    refused(lambda: decode_lindi(counted, spec, "k"), "50000000 items")
    # variable-length kinds are capped at MAX_VLEN_CHUNK_BYTES (here made 1 MiB)
    monkeypatch.setattr(lindi_codecs, "MAX_VLEN_CHUNK_BYTES", CHUNK)
    spec = lindi_spec([{"id": "vlen-utf8"}, {"id": "zlib"}], Kind.VLEN, (4,), "O")
    refused(lambda: decode_lindi(bomb, spec, "k"), "more than the chunk's")
    refused(lambda: lindi_codecs.decode_bytes(bomb, codecs([{"id": "zlib"}]), "k"),
            "more than the chunk's")
    spec = lindi_spec([{"id": "json2"}, {"id": "zstd"}], Kind.JSON_TEXT, (4,), "O")
    refused(lambda: decode_lindi(zstd_frame(16, 16 * 128 * 1024), spec, "k"), "declares")


def test_lindi_valid_pipelines_at_exactly_the_size() -> None:
    data = np.arange(CHUNK // 4, dtype="<i4") * 3
    pipelines = [
        [{"id": "zlib", "level": 5}],
        [{"id": "gzip", "level": 5}],
        [{"id": "blosc", "cname": "lz4", "shuffle": 2}],
        [{"id": "zstd", "level": 3}],
        [{"id": "lz4"}],
        [{"id": "shuffle", "elementsize": 4}, {"id": "zlib"}],
        [{"id": "shuffle", "elementsize": 4}, {"id": "fletcher32"}, {"id": "zstd"}],
        [{"id": "fletcher32"}, {"id": "shuffle", "elementsize": 4}, {"id": "gzip"}],
        [{"id": "fletcher32"}, {"id": "fletcher32"}, {"id": "lz4"}],
        [{"id": "bz2", "level": 5}],
        [{"id": "shuffle", "elementsize": 4}, {"id": "bz2"}],
        [{"id": "lzma"}],
        [{"id": "lzma", "format": lzma.FORMAT_ALONE, "preset": 9}],
    ]
    for configs in pipelines:
        raw: Any = data.tobytes()
        for config in configs:
            raw = numcodecs.get_codec(dict(config)).encode(raw)
        spec = lindi_spec(configs)
        assert lindi_codecs.decode_chunk(bytes(raw), spec, "k") == data.tobytes(), configs
        with pytest.raises(Corrupt):  # one element short of the chunk: not padded
            lindi_codecs.decode_chunk(bytes(raw), lindi_spec(configs, chunks=(CHUNK // 4 + 1,)),
                                      "k")
    texts = np.array(["a", "bé", "", "longer"], dtype=object)
    spec = lindi_spec([{"id": "vlen-utf8"}, {"id": "zlib"}], Kind.VLEN, (2, 2), "O")
    raw = zlib.compress(bytes(numcodecs.VLenUTF8().encode(texts)))
    assert list(numcodecs.VLenUTF8().decode(lindi_codecs.decode_chunk(raw, spec, "k"))) == \
        list(texts)
    with pytest.raises(Corrupt, match="4 items in a chunk of 5"):
        lindi_codecs.decode_chunk(raw, lindi_spec([{"id": "vlen-utf8"}, {"id": "zlib"}],
                                                  Kind.VLEN, (5,), "O"), "k")
    spec = lindi_spec([{"id": "zstd"}], Kind.TEXT, (3,), "<U5")
    words = np.array(["ab", "cdefg", ""], dtype="<U5")
    out = lindi_codecs.decode_chunk(bytes(numcodecs.Zstd().encode(words.tobytes())), spec, "k")
    assert list(numcodecs.VLenUTF8().decode(out)) == list(words)


def test_lindi_codecs_with_no_bound_are_refused() -> None:
    """numcodecs codecs this reader has no bounded decoder for are never run: every
    chunk read is Corrupt, naming the codec."""
    data = np.arange(CHUNK // 4, dtype="<i4").tobytes()
    refused_ids = {"delta": {"dtype": "<i4"}, "packbits": {}, "categorize": {
        "labels": ["a"], "dtype": "<U1"}, "astype": {"encode_dtype": "<i2", "decode_dtype": "<i4"},
        "fixedscaleoffset": {"offset": 0, "scale": 1, "dtype": "<i4"},
        "quantize": {"digits": 2, "dtype": "<f4"}, "bitround": {"keepbits": 3},
        "imagecodecs_lzf": {}}
    for cid, config in refused_ids.items():
        spec = lindi_spec([{"id": cid, **config}])
        assert spec.codecs.problem == f"unsupported codec {cid!r}"
        refused(lambda spec=spec: lindi_codecs.decode_chunk(data, spec, "k"),
                f"unsupported codec {cid!r}")
    raw_lzma = lindi_spec([{"id": "lzma", "format": lzma.FORMAT_RAW,
                            "filters": [{"id": lzma.FILTER_LZMA2}]}])
    packed = lzma.compress(data, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
    refused(lambda: lindi_codecs.decode_chunk(packed, raw_lzma, "k"), "memory limit")


# --------------------------------------------------------------------------- HDF5 filters


def test_h5filters_bombs() -> None:
    bomb = zlib_bomb()
    refused(lambda: decode(bomb, Pipeline(compressor="deflate"), 1, CHUNK, "k"),
            "more than the chunk's")
    refused(lambda: decode(bomb, Pipeline(compressor="deflate", shuffle=True), 4, CHUNK,
                           "k"), "more than the chunk's")
    refused(lambda: decode(blosc_claiming((1 << 31) - 64), Pipeline(compressor="blosc"), 1,
                           CHUNK, "k"), "Blosc frame of")
    refused(lambda: decode(zstd_frame(4, 10 << 30), Pipeline(compressor="zstd"), 1, CHUNK,
                           "k"), "declares")
    hdf5_lz4 = struct.pack(">qi", 10 << 30, 1 << 30) + struct.pack(">i", 4) + bytes(4)
    refused(lambda: decode(hdf5_lz4, Pipeline(compressor="lz4"), 1, CHUNK, "k"), "LZ4 header")
    lzf, bzip = lzf_bomb(), bz2_bomb()
    refused(lambda: decode(lzf, pipeline([{"id": LZF}]), 1, CHUNK, "k"), "LZF stream holds")
    refused(lambda: decode(bzip, pipeline([{"id": BZIP2}]), 1, CHUNK, "k"), "bzip2 data holds")
    # what libhdf5 would be left to undo: h5py's lzf filter and the bzip2 plugin grow
    # their buffers until the stream ends
    refused(lambda: check_for_hdf5(bomb, [(DEFLATE, (4,))], CHUNK, "k"), "more than",
            bound=stored_limit(CHUNK) + BOUND)
    refused(lambda: check_for_hdf5(lzf, [(LZF, (4, 261, CHUNK))], CHUNK, "k"), "LZF stream holds")
    refused(lambda: check_for_hdf5(bzip, [(SHUFFLE, ()), (BZIP2, (9,))], CHUNK, "k"),
            "bzip2 data holds")
    refused(lambda: check_for_hdf5(lzf, [(LZF, (4, 261, CHUNK)), (DEFLATE, (4,))], CHUNK, "k"),
            "zlib decompression failed")
    stated = {
        "szip": ([(SZIP, (169, 8, 32, 30))], struct.pack("<I", 1 << 31) + bytes(8)),
        "nbit": ([(NBIT, (8, 0, 1 << 28, 1, 4, 0, 20, 0))], bytes(100)),
        "scaleoffset": ([(SCALEOFFSET, (2, 0, 1 << 28, 0, 4, 1, 0, 1))], bytes(100)),
        "bitshuffle": ([(BITSHUFFLE, (0, 4, 4, 0, 2))], struct.pack(">qi", 1 << 40, 8192)),
        "after-fletcher": ([(SZIP, (169, 8, 32, 30)), (FLETCHER32, ())],
                           struct.pack("<I", 1 << 31) + bytes(8)),
    }
    for name, (filters, raw) in stated.items():
        with pytest.raises(Corrupt, match="states"):
            check_for_hdf5(raw, filters, CHUNK, name)
    # within the stated sizes: left to libhdf5
    check_for_hdf5(struct.pack("<I", CHUNK) + bytes(8), [(SZIP, (169, 8, 32, 30))], CHUNK, "k")
    check_for_hdf5(bytes(100), [(BITSHUFFLE, (0, 4, 4, 0, 0)), (SHUFFLE, ())], CHUNK, "k")
    # a stated size cannot vouch for a filter undone after it that may grow its output
    with pytest.raises(Corrupt, match="would undo filter 4's output unchecked"):
        check_for_hdf5(struct.pack("<I", CHUNK) + bytes(8),
                       [(DEFLATE, (4,)), (SZIP, (169, 8, 32, 30))], CHUNK, "k")
    check_for_hdf5(struct.pack("<I", CHUNK) + bytes(8),
                   [(SHUFFLE, ()), (FLETCHER32, ()), (SZIP, (169, 8, 32, 30))], CHUNK, "k")
    # nothing says what these make: refused, never trusted (blosc2, zfp, an unregistered id)
    for code in (32026, 32013, 40000):
        with pytest.raises(Corrupt, match=f"filter {code} cannot be held"):
            check_for_hdf5(bytes(100), [(code, ())], CHUNK, "k")


PLUGINS: dict[str, dict[str, Any]] = {
    "gzip_shuffle_fletcher": {"compression": "gzip", "shuffle": True, "fletcher32": True},
    "lzf": {"compression": "lzf"},
    "scaleoffset": {"scaleoffset": 0},
    "blosc": dict(hdf5plugin.Blosc(cname="zstd", shuffle=hdf5plugin.Blosc.SHUFFLE)),
    "zstd": dict(hdf5plugin.Zstd()),
    "lz4": dict(hdf5plugin.LZ4(nbytes=1000)),
    "bitshuffle": dict(hdf5plugin.Bitshuffle(cname="lz4")),
    "bzip2": dict(hdf5plugin.BZip2()),
    "lzf_shuffle_fletcher": {"compression": "lzf", "shuffle": True, "fletcher32": True},
    **({"szip": {"compression": "szip"}} if h5py.h5z.filter_avail(SZIP) else {}),
}
DATA = (np.arange(95 * 70, dtype="<i4").reshape(95, 70) % 1000) * 7
H5_CHUNKS = (20, 50)


def write_filtered(path: Path) -> None:
    """Every PLUGINS pipeline, HDF5 itself writing the chunks (edge chunks included)."""
    with h5py.File(path, "w") as f:
        for name, kwargs in PLUGINS.items():
            f.create_dataset(name, data=DATA, chunks=H5_CHUNKS, **kwargs)


def test_check_for_hdf5_passes_what_hdf5_writes(tmp_path: Path) -> None:
    write_filtered(tmp_path / "f.h5")
    nbytes = math.prod(H5_CHUNKS) * 4
    with h5py.File(tmp_path / "f.h5") as f:
        for name in PLUGINS:
            dsid = f[name].id
            plist = dsid.get_create_plist()
            filters = [(code, values) for code, _flags, values, _name in
                       (plist.get_filter(i) for i in range(plist.get_nfilters()))]
            for offset in ((0, 0), (80, 50)):  # an inner and the corner edge chunk
                mask, raw = dsid.read_direct_chunk(offset)
                assert mask == 0
                check_for_hdf5(raw, filters, nbytes, name)
        # the edge chunk decodes to the full chunk, the dataset's part where it belongs
        raw = f["gzip_shuffle_fletcher"].id.read_direct_chunk((80, 50))[1]
        pipe = Pipeline(fletcher32=True, compressor="deflate", shuffle=True)
        chunk = np.frombuffer(decode(raw, pipe, 4, nbytes, "k"), "<i4").reshape(H5_CHUNKS)
        assert chunk[:15, :20].tobytes() == DATA[80:95, 50:70].tobytes()


def test_lzf_and_bzip2_chunks_decode_as_h5py_reads_them(tmp_path: Path) -> None:
    """The linked path's own LZF and bzip2 decoding, chunk by chunk (edge chunks
    included), gives the bytes h5py reads: also a chunk h5py's optional lzf filter
    could not shrink, stored as it is with a filter mask the linked path never sees."""
    noise = np.random.default_rng(4).integers(0, 1 << 31, DATA.shape, dtype="<i4")
    cases = {"lzf": (DATA, {"compression": "lzf"}),
             "lzf_shuffle_fletcher": (DATA, PLUGINS["lzf_shuffle_fletcher"]),
             "lzf_noise": (noise, {"compression": "lzf"}),
             "bzip2": (DATA, PLUGINS["bzip2"])}
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        for name, (data, kwargs) in cases.items():
            f.create_dataset(name, data=data, chunks=H5_CHUNKS, **kwargs)
    nbytes = math.prod(H5_CHUNKS) * 4
    with h5py.File(path) as f:
        for name, (data, _) in cases.items():
            dsid = f[name].id
            plist = dsid.get_create_plist()
            pipe = pipeline([{"id": code, "name": label.decode()} for code, _, _, label in
                             (plist.get_filter(i) for i in range(plist.get_nfilters()))])
            assert pipe.unknown is None and pipe.compressor in ("lzf", "bzip2"), name
            masks = set()
            for index in np.ndindex(5, 2):
                at = tuple(i * c for i, c in zip(index, H5_CHUNKS, strict=True))
                mask, raw = dsid.read_direct_chunk(at)
                masks.add(mask)
                chunk = np.frombuffer(decode(raw, pipe, 4, nbytes, name), "<i4")
                part = data[at[0]:at[0] + 20, at[1]:at[1] + 50]
                inside = chunk.reshape(H5_CHUNKS)[:part.shape[0], :part.shape[1]]
                assert inside.tobytes() == part.tobytes(), (name, index)
            assert (1 in masks) == (name == "lzf_noise"), (name, masks)


# --------------------------------------------------------------------------- linked stores


def local_uri(url: str) -> tuple[Store, str]:
    return LOCAL, url.lstrip("/")


#: The bomb file's dataset: its shape and HDF5 chunks (640 KB, so a stored chunk of
#: up to ``stored_limit`` 1.28 MB, and a 512 MiB bomb of about 520 KB, is read).
BOMB_SHAPE = (800, 800)
BOMB_CHUNKS = (400, 400)


def write_bomb_file(path: Path, bomb: bytes, compression: Any = "gzip") -> None:
    """``x``: float32 ``BOMB_SHAPE`` in chunks of ones (gzip, or the h5py
    ``compression`` given), chunk (0, 0) a bomb."""
    with h5py.File(path, "w") as f:
        kwargs = compression if isinstance(compression, dict) else {"compression": compression}
        ds = f.create_dataset("x", shape=BOMB_SHAPE, dtype="<f4", chunks=BOMB_CHUNKS, **kwargs)
        ds[...] = 1
        ds.id.write_direct_chunk((0, 0), bomb, filter_mask=0)


def test_linked_hsds_store_refuses_bombs(tmp_path: Path) -> None:
    path = tmp_path / "b.h5"
    write_bomb_file(path, zlib_bomb())
    with h5py.File(path) as f:
        info = f["x"].id.get_chunk_info_by_coord((0, 0))
        good = f["x"].id.get_chunk_info_by_coord(BOMB_CHUNKS)
    opened: list[str] = []

    def open_uri(uri: str) -> tuple[Store, str]:
        opened.append(uri)
        return local_uri(uri)

    def store(entries: dict[str, list[int]]) -> Any:
        et_json = "H5T_IEEE_F32LE"
        t = parse_type(et_json)
        return linked_store("d.json", BOMB_SHAPE, element_type(et_json, t), BOMB_CHUNKS,
                            {"class": "H5D_CHUNKED_REF", "file_uri": str(path),
                             "chunks": entries},
                            filters=GZIP, fill=0, open_uri=open_uri, load_table=None)

    async def main() -> None:
        linked = store({"0_0": [info.byte_offset, info.size],
                        "1_1": [good.byte_offset, good.size],
                        "1_0": [good.byte_offset, 1 << 30]})
        result, peak = await measured_async(lambda: linked.read((0, 0)))
        assert isinstance(result, Corrupt) and "more than" in str(result), result
        assert peak < BOUND
        assert await linked.read((1, 1)) == np.ones(BOMB_CHUNKS, "<f4").tobytes()
        opened.clear()
        with pytest.raises(Corrupt, match="too large"):  # refused before reading 1 GiB
            await linked.read((1, 0))
        assert not opened

    trio.run(main)


async def measured_async(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        try:
            result = await fn()
        except Exception as exc:  # the caller asserts what it is
            result = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def external_scenario(path: str, chunks: tuple[int, ...]) -> dict[str, Any]:
    """Read every chunk of ``x`` in ``path`` through ``H5ExternalArrays`` with the
    ``.zarray`` grid ``chunks``; what each read gave, and the RSS high-water mark
    before and after. Runs in a fresh process (``main``), as libhdf5's memory is
    not seen by tracemalloc."""
    import resource  # noqa: PLC0415

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    shape = DatasetShape(BOMB_SHAPE, chunks, np.dtype("<f4"), bytes(4), "x/.zarray")
    store = H5ExternalArrays(local_uri).store(path, "x", shape)
    results: dict[str, Any] = {}

    async def main() -> None:
        grid = [-(-n // c) for n, c in zip(BOMB_SHAPE, chunks, strict=True)]
        for index in np.ndindex(*grid):
            try:
                data = await store.read(tuple(int(i) for i in index))
                results[str(index)] = None if data is None else \
                    float(np.frombuffer(data, "<f4").sum())
            except (Corrupt, StorageError) as exc:
                results[str(index)] = f"{type(exc).__name__}: {exc}"

    trio.run(main)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"results": results, "grown_kib": after - before}


def run_external(path: Path, chunks: tuple[int, ...]) -> dict[str, Any]:
    code = ("import json, sys; from tests.test_decode_bombs import external_scenario; "
            "print(json.dumps(external_scenario(sys.argv[1], tuple(json.loads(sys.argv[2])))))")
    done = subprocess.run([sys.executable, "-c", code, str(path), json.dumps(list(chunks))],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.splitlines()[-1])


#: Each codec's bomb in an HDF5 file: the bomb, what it inflates to, h5py's filter
#: arguments. Its stored size is within ``stored_limit`` of a 640 KB chunk, so it is
#: read; LZF expands at most about 88 times, so its bomb holds 96 MiB.
FILE_BOMBS: dict[str, tuple[Callable[[], bytes], int, Any]] = {
    "deflate": (lambda: zlib_bomb(2 * BOMB), 2 * BOMB, "gzip"),
    "lzf": (lambda: lzf_bomb(96 * MiB), 96 * MiB, "lzf"),
    "bzip2": (lambda: bz2_bomb(2 * BOMB), 2 * BOMB, dict(hdf5plugin.BZip2())),
}


@pytest.mark.parametrize("codec", list(FILE_BOMBS))
@pytest.mark.parametrize("chunks", [BOMB_CHUNKS, (200, 800)],
                         ids=["linked-path", "h5py-path"])
@pytest.mark.slow
def test_external_array_bomb(tmp_path: Path, chunks: tuple[int, int], codec: str) -> None:
    """A deflate, LZF or bzip2 bomb in the HDF5 file of an external array link: the
    .zarray grid equal to the HDF5 chunks takes the linked path, another grid
    the h5py path (libhdf5's filter, which this must guard: deflate and bzip2
    grow their buffer until the stream ends, h5py's lzf too)."""
    make, inflated, compression = FILE_BOMBS[codec]
    path = tmp_path / "b.h5"
    write_bomb_file(path, make(), compression)
    got = run_external(path, chunks)
    results = got["results"]
    bad = [k for k, v in results.items() if isinstance(v, str)]
    good = {k: v for k, v in results.items() if not isinstance(v, str)}
    if chunks == BOMB_CHUNKS:
        assert bad == ["(0, 0)"]
    else:  # both .zarray chunks of the first 400 rows touch the bomb chunk
        assert bad == ["(0, 0)", "(1, 0)"]
    for key in bad:
        assert results[key].startswith("Corrupt") and "more than" in results[key], results
    assert all(v == float(np.prod(chunks)) for v in good.values()), results
    assert got["grown_kib"] < inflated // 2 // 1024, got  # not what the bomb holds


@pytest.mark.parametrize("grid", [(30, 40), H5_CHUNKS], ids=["h5py-path", "linked-path"])
@pytest.mark.slow
def test_external_h5py_path_reads_every_filter(tmp_path: Path, grid: tuple[int, int]) -> None:
    """The check before h5py reads has no false positives: each HDF5 pipeline,
    through another grid than the HDF5 chunks (edge chunks included), reads as
    h5py reads it; and so does each through the HDF5 chunks' grid, which
    decodes here the pipelines ``layouts.hdf5._filters`` knows (LZF and bzip2
    among them)."""
    path = tmp_path / "f.h5"
    write_filtered(path)

    async def main() -> None:
        arrays = H5ExternalArrays(local_uri)
        for name in PLUGINS:
            shape = DatasetShape(DATA.shape, grid, np.dtype("<i4"), bytes(4), name)
            store = arrays.store(str(path), name, shape)
            for index in np.ndindex(*(-(-n // c) for n, c in zip(DATA.shape, grid,
                                                                 strict=True))):
                got = await store.read(tuple(int(i) for i in index))
                assert got is not None
                block = np.zeros(grid, "<i4")
                rows, cols = (slice(i * c, (i + 1) * c) for i, c in zip(index, grid, strict=True))
                part = DATA[rows, cols]
                block[:part.shape[0], :part.shape[1]] = part
                assert got == block.tobytes(), (name, index)

    trio.run(main)
