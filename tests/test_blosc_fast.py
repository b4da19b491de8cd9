"""``layouts.hdf5._blosc``: Blosc 1 zlib frames inflated with libdeflate, byte for byte
what numcodecs decodes.

Frames are written by numcodecs itself (``Blosc(cname="zlib")`` over arrays of
every typesize 1..16 and beyond, all shuffle modes, memcpyed and raw-stored
streams, split and unsplit blocks, one or many blocks with a leftover), by
c-blosc's global API with ``BLOSC_TYPESIZE`` (sizes that leave a partial
element) and ``BLOSC_SPLITMODE=NEVER`` (large unsplit blocks), and by a real
HSDS (``hsds``). Truncated, corrupted and odd frames must be left to numcodecs
(None) or be ``Corrupt``, never decode to anything but what numcodecs gives
(or, where numcodecs refuses a stream libdeflate accepts, the bytes that were
compressed); a header claiming more than the limit is refused before anything
is allocated. The unmarked tests take about a second; the hypothesis
properties are ``slow``.
"""

from __future__ import annotations

import json
import struct
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import deflate
import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numcodecs.blosc import BITSHUFFLE, NOSHUFFLE, SHUFFLE

from layouts.errors import Corrupt
from layouts.hdf5 import _blosc as blosc
from layouts.hdf5._blosc import DONT_SPLIT, HEADER, MEMCPYED, decode
from layouts.hdf5._inflate import unblosc

MiB = 1 << 20
SHUFFLES = (NOSHUFFLE, SHUFFLE, BITSHUFFLE)
#: Typesizes of the grids: every one c-blosc splits, and a few it never does.
TYPESIZES = (*range(1, 17), 17, 31, 255)
Compress = Callable[..., bytes]


def data_for(elements: int, typesize: int, kind: str, seed: int = 0) -> bytes:
    """``elements`` elements of ``typesize`` bytes: "random" (incompressible),
    "smooth" (low-amplitude noise on a slow ramp, as float data shuffles) or
    "mixed" (random low bytes, constant high bytes: some planes stored raw)."""
    rng = np.random.default_rng(seed)
    size = elements * typesize
    if kind == "random":
        return rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    grid = np.zeros((elements, typesize), np.uint8)
    if kind == "smooth":
        grid[:, 0] = rng.integers(0, 4, elements)
        grid[:, 1:] = (np.arange(elements) // 97 % 251)[:, None]
    else:
        low = max(1, typesize // 2)
        grid[:, :low] = rng.integers(0, 256, (elements, low))
        grid[:, low:] = 7
    return grid.tobytes()


def numcodecs_frame(data: bytes, typesize: int, shuffle: int, clevel: int = 5,
                    blocksize: int = 0) -> bytes:
    """``data`` as numcodecs' ``Blosc(cname="zlib")`` encodes an array of that typesize."""
    codec = numcodecs.Blosc(cname="zlib", clevel=clevel, shuffle=shuffle, blocksize=blocksize)
    return bytes(codec.encode(np.frombuffer(data, f"V{typesize}")))


def assert_same(frame: bytes) -> bytes:
    """Assert the fast path decodes ``frame`` (not None) exactly as numcodecs does."""
    expected = bytes(numcodecs.blosc.decompress(frame))
    fast = decode(frame, len(expected), "k")
    assert fast is not None, HEADER.unpack_from(frame)
    assert fast == expected, HEADER.unpack_from(frame)
    assert unblosc(frame, len(expected), "k") == expected
    return fast


def numcodecs_or_none(frame: bytes) -> bytes | None:
    """What numcodecs decodes ``frame`` to, or None if it refuses it."""
    try:
        return bytes(numcodecs.blosc.decompress(frame))
    except (RuntimeError, ValueError):
        return None


def check_damaged(frame: bytes, original: bytes) -> None:
    """The damaged ``frame`` (once ``original``) decodes to what numcodecs gives, or
    (where numcodecs refuses a stream libdeflate takes) to ``original``; otherwise
    it is left to numcodecs or Corrupt. ``unblosc`` follows the same rule."""
    limit = len(original)
    header = HEADER.unpack_from(frame) if len(frame) >= HEADER.size else None
    # numcodecs only sees what unblosc lets through (c-blosc trusts cbytes)
    sound = header is not None and header[6] == len(frame) and header[4] <= limit
    reference = numcodecs_or_none(frame) if sound else None
    allowed = original if reference is None else reference
    try:
        fast = decode(frame, limit, "k")
    except Corrupt as exc:
        assert exc.key == "k"
    else:
        assert fast is None or fast == allowed
    try:
        whole = unblosc(frame, limit, "k")
    except Corrupt as exc:
        assert exc.key == "k"
    else:
        assert whole == allowed


def measured(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(what ``fn`` returned or raised, the peak of memory it allocated)."""
    tracemalloc.start()
    try:
        try:
            result = fn()
        except Corrupt as exc:
            result = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.fixture
def global_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Compress]:
    """numcodecs' ``compress`` through c-blosc's global API, which reads
    ``BLOSC_TYPESIZE`` (the typesize, whatever the buffer) and ``BLOSC_SPLITMODE``."""
    monkeypatch.setattr(numcodecs.blosc, "use_threads", True)

    def compress(data: bytes, typesize: int, shuffle: int, *, clevel: int = 5,
                 blocksize: int = 0, split: str = "FORWARD_COMPAT") -> bytes:
        monkeypatch.setenv("BLOSC_TYPESIZE", str(typesize))
        monkeypatch.setenv("BLOSC_SPLITMODE", split)
        frame = bytes(numcodecs.blosc.compress(data, b"zlib", clevel, shuffle, blocksize))
        assert frame[3] == typesize
        return frame

    yield compress
    # c-blosc keeps the split mode it read last: put its default back
    compress(bytes(256), 1, NOSHUFFLE)


# --------------------------------------------------------------------------- numcodecs frames


@pytest.mark.parametrize("typesize", TYPESIZES)
def test_every_typesize_and_shuffle(typesize: int) -> None:
    for shuffle in SHUFFLES:
        # tiny (memcpyed), one block (split for typesize <= 16), many blocks + leftover
        for elements, blocksize in ((5, 0), (300, 0), (1001, 1024)):
            frame = numcodecs_frame(data_for(elements, typesize, "smooth"), typesize, shuffle,
                                    blocksize=blocksize)
            assert_same(frame)


def test_split_and_unsplit_blocks(global_api: Compress) -> None:
    data = data_for(4000, 4, "smooth")
    split = global_api(data, 4, SHUFFLE)
    unsplit = global_api(data, 4, SHUFFLE, split="NEVER")
    assert not split[2] & DONT_SPLIT
    assert unsplit[2] & DONT_SPLIT
    for frame in (split, unsplit):
        assert assert_same(frame) == data
    for shuffle in SHUFFLES:
        assert_same(global_api(data_for(20000, 8, "smooth"), 8, shuffle, blocksize=4096,
                               split="NEVER"))


@pytest.mark.parametrize("typesize", [2, 3, 4, 8, 16])
def test_bytes_that_fill_no_element(typesize: int, global_api: Compress) -> None:
    for length in (5, 1001, 5003):
        data = data_for(length, 1, "smooth")
        for shuffle in SHUFFLES:
            for split in ("FORWARD_COMPAT", "NEVER"):
                frame = global_api(data, typesize, shuffle, blocksize=1000, split=split)
                assert HEADER.unpack_from(frame)[4] % typesize
                assert assert_same(frame) == data


def test_raw_stored_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    data = data_for(8192, 4, "mixed")
    frame = numcodecs_frame(data, 4, SHUFFLE, blocksize=4096)
    assert not frame[2] & (MEMCPYED | DONT_SPLIT)
    calls = []
    real = deflate.zlib_decompress

    def counted(raw: Any, size: int) -> bytearray:
        calls.append(size)
        return real(raw, size)

    monkeypatch.setattr(deflate, "zlib_decompress", counted)
    assert assert_same(frame) == data
    # 8 blocks of 4 streams; the planes of the random low bytes are stored raw
    assert 0 < len(calls) < 32


def test_incompressible_and_memcpyed_frames() -> None:
    for typesize in (1, 4, 8):
        random = data_for(5000, typesize, "random")
        assert assert_same(numcodecs_frame(random, typesize, SHUFFLE)) == random
        smooth = data_for(5000, typesize, "smooth")
        copied = numcodecs_frame(smooth, typesize, SHUFFLE, clevel=0)
        assert copied[2] & MEMCPYED
        assert assert_same(copied) == smooth


def test_threads_decode_the_same() -> None:
    frames = [numcodecs_frame(data_for(20000, ts, "smooth", ts), ts, SHUFFLE, blocksize=8192)
              for ts in (2, 4, 8)]
    expected = [bytes(numcodecs.blosc.decompress(f)) for f in frames]
    results: list[bool] = []

    def work() -> None:
        results.extend(decode(f, len(e), "k") == e for _ in range(5)
                       for f, e in zip(frames, expected, strict=True))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 30


# --------------------------------------------------------------------------- odd and damaged frames


def edited(frame: bytes, **fields: int) -> bytes:
    """``frame`` with header fields (version, versionlz, flags, nbytes, blocksize) replaced."""
    values = dict(zip(("version", "versionlz", "flags", "typesize", "nbytes", "blocksize",
                       "cbytes"), HEADER.unpack_from(frame), strict=True))
    values.update(fields)
    return HEADER.pack(*values.values()) + frame[HEADER.size:]


def test_odd_headers_are_left_to_numcodecs() -> None:
    data = data_for(3000, 4, "smooth")
    frame = numcodecs_frame(data, 4, SHUFFLE, blocksize=4096)
    flags = frame[2]
    for odd in (edited(frame, version=1), edited(frame, version=3),
                edited(frame, versionlz=2), edited(frame, flags=flags | 0x08),
                edited(frame, flags=flags | 0x04), edited(frame, blocksize=0),
                edited(frame, blocksize=len(data) + 1), edited(frame, nbytes=0, blocksize=0)):
        assert decode(odd, len(data), "k") is None
        check_damaged(odd, data)
    lz4 = bytes(numcodecs.Blosc(cname="lz4").encode(np.frombuffer(data, "<u4")))
    assert decode(lz4, len(data), "k") is None
    assert unblosc(lz4, len(data), "k") == data


def test_offsets_and_sizes_outside_the_frame_are_left_to_numcodecs() -> None:
    data = data_for(3000, 4, "smooth")
    frame = bytearray(numcodecs_frame(data, 4, SHUFFLE, blocksize=4096))
    (start,) = struct.unpack_from("<i", frame, HEADER.size)
    for offset, value in ((HEADER.size, len(frame) - 3), (HEADER.size, -1),
                          (start, -5), (start, len(frame))):
        damaged = bytearray(frame)
        struct.pack_into("<i", damaged, offset, value)
        assert decode(bytes(damaged), len(data), "k") is None
        with pytest.raises(Corrupt, match="Blosc decompression failed"):
            unblosc(bytes(damaged), len(data), "k")


def test_split_streams_not_covering_their_block_are_corrupt() -> None:
    # c-blosc would leave the block's last byte as whatever its buffer held
    frame = numcodecs_frame(data_for(1024, 4, "smooth"), 4, SHUFFLE)
    odd = edited(frame, nbytes=4095, blocksize=4095)
    with pytest.raises(Corrupt, match="split in 4 streams") as info:
        decode(odd, 4096, "key/0_0")
    assert info.value.key == "key/0_0"


def test_truncated_frames() -> None:
    data = data_for(5000, 8, "smooth")
    frame = numcodecs_frame(data, 8, SHUFFLE, blocksize=4096)
    for cut in (0, 10, 16, 40, len(frame) // 2, len(frame) - 1):
        short = frame[:cut]
        if cut >= HEADER.size:
            with pytest.raises(Corrupt, match="says"):
                decode(short, len(data), "k")
        else:
            assert decode(short, len(data), "k") is None
        with pytest.raises(Corrupt):
            unblosc(short, len(data), "k")
        if cut >= HEADER.size:  # the header made to agree: the streams are cut
            check_damaged(short[:12] + struct.pack("<I", cut) + short[16:], data)


def test_damaged_frames_never_decode_wrong() -> None:
    rng = np.random.default_rng(2024)
    for round_ in range(150):
        typesize = int(rng.choice([1, 2, 4, 8]))
        data = data_for(int(rng.integers(200, 2000)), typesize, "smooth", round_)
        frame = bytearray(numcodecs_frame(data, typesize, int(rng.integers(0, 3)),
                                          blocksize=int(rng.choice([0, 1024]))))
        for _ in range(int(rng.integers(1, 4))):
            frame[int(rng.integers(HEADER.size, len(frame)))] = int(rng.integers(0, 256))
        check_damaged(bytes(frame), data)


def test_claiming_more_than_the_limit_is_refused_before_allocating() -> None:
    data = data_for(MiB // 4, 4, "smooth")
    frame = numcodecs_frame(data, 4, SHUFFLE)
    bomb = edited(frame, nbytes=(1 << 31) - 64, blocksize=1 << 20)
    result, peak = measured(lambda: decode(bomb, MiB, "k"))
    assert isinstance(result, Corrupt) and "more than the chunk's 1048576" in str(result)
    assert peak < 64 * 1024
    result, peak = measured(lambda: decode(frame, MiB - 1, "k"))
    assert isinstance(result, Corrupt)
    assert peak < 64 * 1024
    assert decode(frame, MiB, "k") == data


def test_unblosc_decodes_zlib_frames_without_numcodecs(monkeypatch: pytest.MonkeyPatch) -> None:
    data = data_for(5000, 4, "smooth")
    frame = numcodecs_frame(data, 4, SHUFFLE)
    lz4 = bytes(numcodecs.Blosc(cname="lz4").encode(np.frombuffer(data, "<u4")))

    def refuse(raw: Any) -> bytes:
        raise RuntimeError("numcodecs was called")

    monkeypatch.setattr(numcodecs.blosc, "decompress", refuse)
    assert unblosc(frame, len(data), "k") == data
    with pytest.raises(Corrupt, match="numcodecs was called"):
        unblosc(lz4, len(data), "k")


# --------------------------------------------------------------------------- a real HSDS


def _dataset_dir(bucket_dir: Path, domain: str, name: str) -> Path:
    def read(key: str) -> Any:
        return json.loads((bucket_dir / key).read_text())

    root = str(read(f"{domain}/.domain.json")["root"])
    dset_id = str(read(f"db/{root[2:19]}/.group.json")["links"][name]["id"])
    return bucket_dir / f"db/{dset_id[2:19]}/d/{dset_id[20:]}"


@pytest.mark.hsds
def test_frames_written_by_hsds(hsds_bucket: Any) -> None:
    bucket_dir = hsds_bucket.bucket_dir
    gzip_chunk = _dataset_dir(bucket_dir, "home/admin/filters.h5", "gzip") / "0_0"
    head = gzip_chunk.read_bytes()[:HEADER.size]
    assert head[0] == blosc.VERSION and head[2] >> 5 == blosc.ZLIB_FORMAT
    frames = 0
    for path in sorted(bucket_dir.glob("db/**/d/*/*")):
        raw = path.read_bytes()
        header = HEADER.unpack_from(raw) if len(raw) >= HEADER.size else None
        if header and header[0] == blosc.VERSION and header[2] >> 5 == blosc.ZLIB_FORMAT \
                and header[6] == len(raw):
            assert_same(raw)
            frames += 1
    assert frames >= 20


# --------------------------------------------------------------------------- properties


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(typesize=st.one_of(st.integers(1, 16), st.integers(17, 255)),
       elements=st.integers(1, 4000), shuffle=st.sampled_from(SHUFFLES),
       clevel=st.integers(0, 9), blocksize=st.sampled_from([0, 128, 200, 1000, 4096, 65536]),
       kind=st.sampled_from(["random", "smooth", "mixed"]), seed=st.integers(0, 2**16))
def test_property_numcodecs_frames(typesize: int, elements: int, shuffle: int, clevel: int,
                                   blocksize: int, kind: str, seed: int) -> None:
    data = data_for(elements, typesize, kind, seed)
    assert assert_same(numcodecs_frame(data, typesize, shuffle, clevel, blocksize)) == data


@pytest.mark.slow
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(typesize=st.integers(1, 20), length=st.integers(1, 40000),
       shuffle=st.sampled_from(SHUFFLES), clevel=st.integers(0, 9),
       blocksize=st.sampled_from([0, 128, 999, 4096, 32768]),
       split=st.sampled_from(["FORWARD_COMPAT", "NEVER", "AUTO"]),
       kind=st.sampled_from(["random", "smooth", "mixed"]), seed=st.integers(0, 2**16))
def test_property_partial_elements_and_split_modes(
        global_api: Compress, typesize: int, length: int, shuffle: int, clevel: int,
        blocksize: int, split: str, kind: str, seed: int) -> None:
    data = data_for(length, 1, kind, seed)
    frame = global_api(data, typesize, shuffle, clevel=clevel, blocksize=blocksize, split=split)
    assert assert_same(frame) == data


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(typesize=st.sampled_from([1, 2, 3, 4, 8, 16]), elements=st.integers(1, 3000),
       shuffle=st.sampled_from(SHUFFLES), blocksize=st.sampled_from([0, 256, 1024]),
       kind=st.sampled_from(["smooth", "mixed"]), seed=st.integers(0, 2**16),
       edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                      min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.floats(0, 1)))
def test_property_damaged_frames(typesize: int, elements: int, shuffle: int, blocksize: int,
                                 kind: str, seed: int, edits: list[tuple[float, int]],
                                 cut: float | None) -> None:
    data = data_for(elements, typesize, kind, seed)
    frame = bytearray(numcodecs_frame(data, typesize, shuffle, blocksize=blocksize))
    for where, value in edits:
        frame[int(where * len(frame))] = value
    if cut is not None:
        frame = frame[:HEADER.size + int(cut * (len(frame) - HEADER.size))]
        struct.pack_into("<I", frame, 12, len(frame))
    check_damaged(bytes(frame), data)
