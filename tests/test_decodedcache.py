"""Decoded chunks in the disk cache (``-o cache_decoded``): ``mountd.io.decodedcache``.

A real ``DiskCache`` in ``tmp_path`` under a real ``BlockCache``, over the
in-memory store of the block-cache tests; a new block cache over the same
directory stands for a remount. Then the HSDS and reference-file chunk
readers through it: a chunk kept decoded is neither fetched nor decoded
again. The option itself is parsed in ``mountd.config``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import trio

from layouts.formats.hsds import _ids as hsds_ids
from layouts.formats.hsds._chunks import ChunkSpec, HsdsChunkStore, filter_plan
from layouts.formats.refs import _codecs as lindi_codecs
from layouts.formats.refs._catalog import RefChunkStore, RefReader
from layouts.formats.refs._codecs import Kind
from layouts.formats.refs._table import RangeRef, Ref
from layouts.hdf5._types import element_type, parse_type
from mountd.config import MountConfig, OptionError, apply_options
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.decodedcache import SEPARATOR, DecodedDiskCache
from mountd.io.diskcache import DiskCache
from mountd.io.local import LocalStore
from tests.test_blockcache import MemoryStore
from tests.test_diskcache import files, plenty

DECODED = b"decoded bytes " * 100_000  # larger than a block of the disk cache


def remount(root: Path) -> tuple[BlockCache, DecodedDiskCache]:
    """A fresh block cache and decoded cache over the disk cache in ``root``."""
    blocks = BlockCache(1 << 20, disk=DiskCache(root, 64 << 20, free_space=plenty))
    return blocks, DecodedDiskCache(blocks)


def decoded_files(root: Path) -> list[Path]:
    """The disk-cache files of decoded chunks (their meta names the key with SEPARATOR)
    in ``root``, a cache_dir; files being written are left out."""
    mark = json.dumps(SEPARATOR)[1:-1].encode()
    return [p for p in files(root) if p.suffix != ".tmp" and mark in p.read_bytes()[:4096]]


def wait_decoded(root: Path, count: int) -> None:
    """Wait until the cache_dir ``root`` holds ``count`` decoded chunks (a mount writes
    them behind, and drops what is not written yet when it is unmounted)."""
    for _ in range(200):
        if len(decoded_files(root)) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} decoded chunks were not written to {root}")


def kept_over(root: Path, store: MemoryStore, etag: str) -> None:
    """Put ``DECODED`` for object ``a`` at ``etag``, token ``t1``, through one mount."""
    blocks, decoded = remount(root)

    async def main() -> None:
        await decoded.put(CachedStore(store, blocks), "a", "t1", etag, DECODED)

    trio.run(main)


def test_a_kept_chunk_is_served_after_a_remount(tmp_path: Path) -> None:
    store = MemoryStore()
    etag = store.put("a", b"raw")
    kept_over(tmp_path, store, etag)
    assert len(decoded_files(tmp_path)) == 1
    blocks, decoded = remount(tmp_path)
    cached = CachedStore(store, blocks)

    async def main() -> None:
        assert await decoded.get(cached, "a", "t1") == DECODED
        assert await decoded.get(cached, "a", "t1") == DECODED
    trio.run(main)
    assert store.fetches() == [] and store.heads() == 1  # validated once within the TTL
    assert (blocks.stats.decoded_hits, blocks.stats.decoded_misses) == (2, 0)


def test_a_chunk_never_kept_costs_no_request(tmp_path: Path) -> None:
    store = MemoryStore()
    store.put("a", b"raw")
    blocks, decoded = remount(tmp_path)

    async def main() -> None:
        assert await decoded.get(CachedStore(store, blocks), "a", "t1") is None
    trio.run(main)
    assert store.requests == []
    assert (blocks.stats.decoded_hits, blocks.stats.decoded_misses) == (0, 1)


def test_a_changed_object_is_a_miss_and_its_chunk_removed(tmp_path: Path) -> None:
    store = MemoryStore()
    kept_over(tmp_path, store, store.put("a", b"raw"))
    store.put("a", b"new raw")
    blocks, decoded = remount(tmp_path)

    async def main() -> None:
        assert await decoded.get(CachedStore(store, blocks), "a", "t1") is None
    trio.run(main)
    assert blocks.disk is not None and blocks.disk.stats.stale == 1
    assert decoded_files(tmp_path) == []


def test_another_token_is_a_miss(tmp_path: Path) -> None:
    store = MemoryStore()
    kept_over(tmp_path, store, store.put("a", b"raw"))
    blocks, decoded = remount(tmp_path)

    async def main() -> None:
        cached = CachedStore(store, blocks)
        assert await decoded.get(cached, "a", "t2") is None
        assert await decoded.get(cached, "a", "t1") == DECODED
    trio.run(main)
    assert store.heads() == 1  # t2 was never kept: no head for it


def test_a_broken_file_is_a_miss_and_removed(tmp_path: Path) -> None:
    store = MemoryStore()
    kept_over(tmp_path, store, store.put("a", b"raw"))
    [path] = decoded_files(tmp_path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    blocks, decoded = remount(tmp_path)

    async def main() -> None:
        assert await decoded.get(CachedStore(store, blocks), "a", "t1") is None
    trio.run(main)
    assert blocks.disk is not None and blocks.disk.stats.corrupt == 1
    assert not path.exists()


def test_a_gone_object_is_a_miss(tmp_path: Path) -> None:
    store = MemoryStore()
    kept_over(tmp_path, store, store.put("a", b"raw"))
    del store.objects["a"]
    blocks, decoded = remount(tmp_path)

    async def main() -> None:
        assert await decoded.get(CachedStore(store, blocks), "a", "t1") is None
    trio.run(main)
    assert blocks.stats.decoded_misses == 1


def test_local_and_foreign_stores_take_no_part(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a").write_bytes(b"raw")
    local = LocalStore(tmp_path / "data")
    blocks, decoded = remount(tmp_path / "cache")
    other = CachedStore(MemoryStore(), BlockCache(1 << 20))  # another block cache's store
    assert not decoded.keeps(local) and not decoded.keeps(other)

    async def main() -> None:
        for store in (local, other):
            await decoded.put(store, "a", "t1", "e1", DECODED)
            assert await decoded.get(store, "a", "t1") is None
    trio.run(main)
    assert files(tmp_path / "cache") == []
    assert (blocks.stats.decoded_hits, blocks.stats.decoded_misses) == (0, 0)


def test_puts_go_behind_in_the_nursery(tmp_path: Path) -> None:
    store = MemoryStore()
    etag = store.put("a", b"raw")
    blocks, decoded = remount(tmp_path)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            blocks.nursery = nursery
            await decoded.put(CachedStore(store, blocks), "a", "t1", etag, DECODED)
            assert decoded_files(tmp_path) == []  # not written yet: the caller did not wait
        assert len(decoded_files(tmp_path)) == 1
    trio.run(main)


# --------------------------------------------------------------------------- HSDS chunks

DSET = hsds_ids.parse_id("d-02cd0518-2c584e72-86ef-55279d-623eb6")
GZIP = [{"class": "H5Z_FILTER_DEFLATE", "id": 1, "level": 6}]
CHUNK = (256, 256)


def spec(tj: dict[str, str] | None = None) -> ChunkSpec:
    tj = tj or {"class": "H5T_FLOAT", "base": "H5T_IEEE_F64LE"}
    htype = parse_type(tj)
    return ChunkSpec(htype=htype, etype=element_type(tj, htype), chunks=CHUNK,
                     plan=filter_plan(GZIP))


def chunk(i: int) -> np.ndarray:
    return np.arange(CHUNK[0] * CHUNK[1], dtype="<f8").reshape(CHUNK) * (i + 1)


def chunk_store() -> MemoryStore:
    """Four 512 KiB chunks of a (512, 512) float64 dataset, as HSDS stores gzip."""
    store = MemoryStore()
    blosc = numcodecs.Blosc(cname="zlib", clevel=6, shuffle=numcodecs.Blosc.SHUFFLE)
    for i, index in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        store.put(DSET.chunk_dir() + hsds_ids.chunk_name(index), blosc.encode(chunk(i)))
    return store


def test_hsds_chunks_kept_decoded_are_neither_fetched_nor_decoded(tmp_path: Path) -> None:
    store = chunk_store()
    indices = [(0, 0), (0, 1), (1, 0), (1, 1), (5, 5)]  # (5, 5): off the grid
    want = [chunk(i).tobytes() for i in range(4)] + [None]

    async def main() -> None:
        blocks, decoded = remount(tmp_path)
        first = HsdsChunkStore(CachedStore(store, blocks), DSET, (512, 512), spec(),
                               decoded=decoded)
        assert await first.read((0, 0)) == want[0]
        assert await first.read_many(indices) == want
        assert blocks.stats.decoded_misses == 4 and len(decoded_files(tmp_path)) == 4
        store.requests.clear()

        blocks, decoded = remount(tmp_path)
        again = HsdsChunkStore(CachedStore(store, blocks), DSET, (512, 512), spec(),
                               decoded=decoded)
        assert await again.read_many(indices) == want
        assert await again.read((1, 1)) == want[3]
        assert store.fetches() == [] and store.heads() == 4
        assert (blocks.stats.decoded_hits, blocks.stats.decoded_misses) == (5, 0)

        # Another decode of the same objects (here: as another type) is not served
        # these bytes; it reads the objects and keeps its own.
        blocks, decoded = remount(tmp_path)
        other = HsdsChunkStore(CachedStore(store, blocks), DSET, (512, 512),
                               spec({"class": "H5T_INTEGER", "base": "H5T_STD_I64LE"}),
                               decoded=decoded)
        assert await other.read_many(indices) == want
        assert (blocks.stats.decoded_hits, blocks.stats.decoded_misses) == (0, 4)
        assert len(decoded_files(tmp_path)) == 8
    trio.run(main)


def test_hsds_chunk_changed_after_it_was_kept_is_read_again(tmp_path: Path) -> None:
    store = chunk_store()
    key = DSET.chunk_dir() + hsds_ids.chunk_name((0, 0))

    async def main() -> None:
        blocks, decoded = remount(tmp_path)
        first = HsdsChunkStore(CachedStore(store, blocks), DSET, (512, 512), spec(),
                               decoded=decoded)
        assert await first.read((0, 0)) == chunk(0).tobytes()
        store.put(key, store.objects[DSET.chunk_dir() + hsds_ids.chunk_name((1, 1))][0])
        del store.objects[DSET.chunk_dir() + hsds_ids.chunk_name((0, 1))]

        blocks, decoded = remount(tmp_path)
        again = HsdsChunkStore(CachedStore(store, blocks), DSET, (512, 512), spec(),
                               decoded=decoded)
        assert await again.read((0, 0)) == chunk(3).tobytes()
        assert await again.read((0, 1)) is None  # never kept, and gone: the fill value
        blocks, decoded = remount(tmp_path)
        third = HsdsChunkStore(CachedStore(store, blocks), DSET, (512, 512), spec(),
                               decoded=decoded)
        assert await third.read((0, 0)) == chunk(3).tobytes()
        assert blocks.stats.decoded_hits == 1
    trio.run(main)


def test_hsds_chunks_of_a_local_bucket_are_not_kept(tmp_path: Path) -> None:
    chunk_dir = tmp_path / "bucket" / DSET.chunk_dir()
    chunk_dir.mkdir(parents=True)
    blosc = numcodecs.Blosc(cname="zlib", clevel=6, shuffle=numcodecs.Blosc.SHUFFLE)
    (chunk_dir / "0_0").write_bytes(blosc.encode(chunk(0)))
    _, decoded = remount(tmp_path / "cache")
    store = HsdsChunkStore(LocalStore(tmp_path / "bucket"), DSET, (512, 512), spec(),
                           decoded=decoded)

    async def main() -> None:
        assert await store.read((0, 0)) == chunk(0).tobytes()
        assert await store.read_many([(0, 0)]) == [chunk(0).tobytes()]
    trio.run(main)
    assert files(tmp_path / "cache") == []


# --------------------------------------------------------------------------- reference files

URL = "http://files.example/big.h5"


def ref_chunks(store: MemoryStore, blocks: BlockCache,
               decoded: DecodedDiskCache) -> RefChunkStore:
    """Two zlib chunks of 4096 int32 as byte ranges of one file in ``store`` (put
    there once); the refs are read through ``blocks``, as a mount reads a URL."""
    cached = CachedStore(store, blocks)
    zlib = numcodecs.Zlib(4)
    parts = [zlib.encode(np.arange(4096, dtype="<i4") * (i + 1)) for i in range(2)]
    if "big.h5" not in store.objects:
        store.put("big.h5", b"header" + b"".join(parts))
    refs: dict[str, Ref] = {
        "x/0": RangeRef(URL, 6, len(parts[0])),
        "x/1": RangeRef(URL, 6 + len(parts[0]), len(parts[1])),
    }
    spec = lindi_codecs.ChunkSpec(Kind.RAW, (4096,), np.dtype("<i4"), np.dtype("<i4"),
                                  lindi_codecs.codecs([{"id": "zlib", "level": 4}]),
                                  bytes(4))
    return RefChunkStore(refs, RefReader(lambda url: (cached, "big.h5")), "x", (8192,), spec,
                         separator=".", names="0\n1", meta_key="x/.zarray", decoded=decoded)


def test_reference_chunks_kept_decoded_are_neither_fetched_nor_decoded(tmp_path: Path) -> None:
    store = MemoryStore()
    want = [(np.arange(4096, dtype="<i4") * (i + 1)).tobytes() for i in range(2)]

    async def main() -> None:
        blocks, decoded = remount(tmp_path)
        first = ref_chunks(store, blocks, decoded)
        assert [await first.read((i,)) for i in range(2)] == want
        assert blocks.stats.decoded_misses == 2 and len(decoded_files(tmp_path)) == 2
        store.requests.clear()
        blocks, decoded = remount(tmp_path)
        again = ref_chunks(store, blocks, decoded)
        assert [await again.read((i,)) for i in range(2)] == want
        assert store.fetches() == [] and store.heads() == 1  # one file, validated once
        assert (blocks.stats.decoded_hits, blocks.stats.decoded_misses) == (2, 0)
    trio.run(main)


# --------------------------------------------------------------------------- the option


@pytest.mark.parametrize(("options", "on"), [
    ("cache_dir=/c,cache_decoded", True),
    ("cache_dir=/c,cache_decoded=on", True),
    ("cache_dir=/c,cache_decoded=off", False),
    ("cache_decoded=off", False),
    ("cache_dir=/c", False),
])
def test_cache_decoded_option(options: str, on: bool) -> None:
    config = MountConfig("s3://b", "/mnt")
    apply_options(config, [options])
    assert config.cache_decoded is on


@pytest.mark.parametrize(("options", "message"), [
    ("cache_decoded", "cache_decoded needs cache_dir"),
    ("cache_decoded=on", "cache_decoded needs cache_dir"),
    ("cache_dir=/c,cache_decoded=yes", "cache_decoded=on or cache_decoded=off"),
])
def test_cache_decoded_option_refused(options: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        apply_options(MountConfig("s3://b", "/mnt"), [options])
