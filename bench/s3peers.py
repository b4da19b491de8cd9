"""The S3 benchmark's peers that do not go through the mount.

This module owns two ways of reading all of ``big.h5``'s 1 GiB from the moto
bucket, each returning ``(seconds, decoded bytes)``:

- :class:`ChunkFetcher`: plain aiobotocore GETs of the dataset's chunk
  objects, ``concurrency`` requests in flight, each decoded with the mount's
  own decoder (``layouts.formats.hsds._chunks.decode_chunk``), or with
  ``numcodecs.blosc`` (``numcodecs=True``), on a 2-thread pool: what the
  network and the CPUs allow here, with nothing of the mount in between;
- :func:`h5pyd_read`: h5pyd reading the dataset in row slabs through a real
  HSDS service whose storage is the same bucket.

Both check the first chunk against ``bench.data``'s recipe. ``h5pyd_file``
opens an h5pyd file as admin without letting h5pyd silence the root logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numcodecs.blosc
import numpy as np
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from bench import data as benchdata
from layouts.formats.hsds._chunks import ChunkSpec, decode_chunk, filter_plan
from layouts.hdf5._types import element_type, parse_type
from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER

DECODE_THREADS = 2
CONCURRENCY = 8


class PeerError(RuntimeError):
    """A peer read wrong data or failed; the message says which."""


def chunk_spec(dataset_json: Mapping[str, Any]) -> ChunkSpec:
    """The mount's decoding spec for a dataset, from its HSDS ``.dataset.json``."""
    tj = dataset_json["type"]
    htype = parse_type(tj)
    cprops = dataset_json.get("creationProperties") or {}
    layout = dataset_json.get("layout") or cprops.get("layout") or {}
    return ChunkSpec(htype=htype, etype=element_type(tj, htype),
                     chunks=tuple(int(d) for d in layout["dims"]),
                     plan=filter_plan(cprops.get("filters") or []))


def check_first_chunk(decoded: bytes) -> None:
    """Raise PeerError unless ``decoded`` is chunk (0, 0) of the recipe."""
    rows, cols = benchdata.CHUNKS
    got = np.frombuffer(decoded, dtype=benchdata.DTYPE).reshape(rows, cols)
    if not np.array_equal(got, benchdata.block_values(0, rows)[:, :cols]):
        raise PeerError("chunk 0_0 decodes to the wrong values")


class ChunkFetcher:
    """aiobotocore GETs of chunk objects, decoded on ``DECODE_THREADS`` threads.

    At most ``concurrency`` chunks are in flight (being fetched or decoded),
    so memory stays bounded. ``decode=False`` measures the GETs alone.
    """

    def __init__(self, endpoint: str, env: Mapping[str, str], bucket: str, *,
                 keys: Sequence[str], spec: ChunkSpec, concurrency: int = CONCURRENCY) -> None:
        self.endpoint = endpoint
        self.env = dict(env)
        self.bucket = bucket
        self.keys = list(keys)
        self.spec = spec
        self.concurrency = concurrency
        self.pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="decode")

    def close(self) -> None:
        self.pool.shutdown()

    def read_all(self, *, decode: bool = True, check: bool = False,
                 numcodecs: bool = False) -> tuple[float, int]:
        """Fetch (and decode) every chunk once; (seconds, bytes) without client set-up.
        ``numcodecs``: decode the Blosc frames with ``numcodecs.blosc`` instead of the
        mount's decoder (the chunks are Blosc frames with the shuffle inside)."""
        decoder = _numcodecs_decode if numcodecs else decode_chunk
        return asyncio.run(self._read_all(decode, check, decoder))

    async def _read_all(self, decode: bool, check: bool,
                        decoder: Callable[[bytes, ChunkSpec, str], bytes]) -> tuple[float, int]:
        config = AioConfig(max_pool_connections=self.concurrency,
                           s3={"addressing_style": "path"})
        async with get_session().create_client(
                "s3", endpoint_url=self.endpoint, region_name=self.env["AWS_REGION"],
                aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                config=config) as client:
            loop = asyncio.get_running_loop()
            limit = asyncio.Semaphore(self.concurrency)

            async def one(key: str) -> int:
                async with limit:
                    resp = await client.get_object(Bucket=self.bucket, Key=key)
                    async with resp["Body"] as body:
                        raw = await body.read()
                    if not decode:
                        return len(raw)
                    out = await loop.run_in_executor(self.pool, decoder, raw, self.spec, key)
                    if check and key.endswith("/0_0"):
                        check_first_chunk(out)
                    return len(out)

            started = time.perf_counter()
            total = sum(await asyncio.gather(*(one(key) for key in self.keys)))
            return time.perf_counter() - started, total


def _numcodecs_decode(raw: bytes, spec: ChunkSpec, key: str) -> bytes:
    """A bench chunk object decoded by ``numcodecs.blosc`` alone."""
    out = numcodecs.blosc.decompress(raw)
    if len(out) != spec.nbytes:
        raise PeerError(f"{key}: numcodecs decoded {len(out)} bytes, expected {spec.nbytes}")
    return out


@contextlib.contextmanager
def h5pyd_file(endpoint: str, domain: str, mode: str) -> Iterator[Any]:
    """``h5pyd.File`` as admin; the root logger's level is restored after the open.

    h5pyd 1.0.0 sets the root logger to ERROR whenever it opens a file.
    """
    import h5pyd  # noqa: PLC0415 - peer library, only the peers need it

    root = logging.getLogger()
    level = root.level
    try:
        f = h5pyd.File(domain, mode, endpoint=endpoint, username=ADMIN_USER,
                       password=ADMIN_PASSWORD)
    finally:
        root.setLevel(level)
    with f:
        yield f


def h5pyd_read(endpoint: str, domain: str, dataset: str, slab_rows: int) -> tuple[float, int]:
    """h5pyd: open ``domain`` and read ``dataset`` in ``slab_rows`` row slabs; check row 0.

    Returns (seconds, bytes read), the open included.
    """
    total = 0
    first: np.ndarray | None = None
    started = time.perf_counter()
    with h5pyd_file(endpoint, domain, "r") as f:
        dset = f[dataset]
        for row0 in range(0, dset.shape[0], slab_rows):
            block = dset[row0:row0 + slab_rows]
            total += block.nbytes
            if first is None:
                first = block[:benchdata.CHUNKS[0], :benchdata.CHUNKS[1]]
    seconds = time.perf_counter() - started
    if first is None:
        raise PeerError("h5pyd read nothing")
    check_first_chunk(np.ascontiguousarray(first).tobytes())
    return seconds, total
