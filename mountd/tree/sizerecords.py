"""The sizes of view files kept by what they derive from, in memory and in ``cache_dir``.

Owns ``SizeRecords``. A view file's exact size can cost a pass over its
data (a table's CSV is counted block by block). When that pass read nothing
but the chunks of the view's own dataset, the size is kept under the
file's path, validated by a digest of everything its bytes derive from:
the dataset's version (``Tree.data_version``: its description and its
stored chunks with their validators, the same in every mount), its
attributes, the view and ``FORMAT``. It is kept in memory (the latest
record of each file, ``MEMORY_BYTES`` of them at most) and, with
``-o cache_dir``, in the mount's disk cache (``mountd.io.diskcache``) under
the source too. A later period whose objects are new instances, or a later
mount, that learns the same version reads the size back with no chunk
read; any change to the data, the attributes or h5mount's view makes
another digest, and the size is counted again (and kept under the new
one). Views that read other objects (anndata, LEGEND) are not kept: their
inputs are more than one dataset's version.

A view file made of blocks of its dataset's rows (a table's CSV, a
column's lines) also has the counts of its blocks kept, as one record
(``load_blocks``, ``save_blocks``), validated without the data's version:
by the view, ``FORMAT``, the attributes and what the chunks are decoded by
(``mountd.cache.dataepochs.decoding``). Each block's count carries the
digest of its chunks' validators, which ``mountd.tree.blockcounts``
checks block by block, so a changed or appended chunk costs a count of
its blocks only.

Concurrency: the memory records change with no ``await`` in between; the
disk cache's calls are safe from any task. Nothing raises but ``Cancelled``.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from layouts.model import Dataset
from mountd.cache.dataepochs import decoding
from mountd.cache.memo import Memo
from mountd.io.diskcache import DiskCache

#: Raise when the bytes a view makes of the same data change (a format fix):
#: sizes kept by an older h5mount are then not used.
FORMAT = 1
_SIZE_BYTES = 8
#: Ends the name of every size kept (NUL: in no store key, so no block's name).
SUFFIX = "\0view size\0"
#: Bytes of records kept in memory (a 10 GiB table's block counts take 1.6 MB).
MEMORY_BYTES = 16 << 20
#: Ends the name of every record of block counts.
BLOCKS_SUFFIX = "\0view blocks\0"
#: One block's count on disk: its first and last rows, digest and count.
BLOCK_RECORD = np.dtype([("start", "<i8"), ("stop", "<i8"), ("digest", "V16"), ("count", "<i8")])
#: The counts of a file's blocks by their rows: each block's digest and count.
Blocks = dict[tuple[int, int], tuple[bytes, int]]


def _attributes(ds: Dataset) -> bytes:
    """The dataset's attributes, each whole (arrays by their bytes, and arrays
    inside other values printed in full, not shortened with ``...``)."""
    parts = []
    with np.printoptions(threshold=sys.maxsize):
        for attr in ds.attrs:
            value = attr.value
            shown = (value.dtype.str, value.shape, value.tobytes()) \
                if isinstance(value, np.ndarray) else value
            parts.append(repr((attr.name, shown, attr.dtype, attr.hdf5, attr.shape)))
    return "\n".join(parts).encode("utf-8", "surrogateescape")


class SizeRecords:
    """View file sizes of one source, kept in memory and, with ``cache_dir``,
    in its disk cache."""

    def __init__(self, disk: DiskCache | None, source: str,
                 memory_bytes: int = MEMORY_BYTES) -> None:
        self._disk = disk
        self._source = source
        #: The latest record of each name, as (validator, bytes).
        self._memory = Memo(budget=memory_bytes)

    @staticmethod
    def validator(view: str, ds: Dataset, version: bytes) -> str:
        """The digest a size of ``view`` over ``ds`` at ``version`` is kept under."""
        return _digest(repr((FORMAT, view)).encode(), version, _attributes(ds))

    @staticmethod
    def blocks_validator(view: str, ds: Dataset) -> str:
        """The digest the block counts of ``view`` over ``ds`` are kept under."""
        return _digest(repr((FORMAT, view, "blocks")).encode(),
                       decoding(ds).encode("utf-8", "surrogateescape"), _attributes(ds))

    async def load(self, name: str, validator: str) -> int | None:
        """The size kept as ``name`` under ``validator`` by this or an earlier mount."""
        data = await self._get(name + SUFFIX, validator)
        if data is None or len(data) != _SIZE_BYTES:
            return None
        return int.from_bytes(data, "little")

    async def save(self, name: str, validator: str, size: int) -> None:
        """Keep ``size`` as ``name`` under ``validator``."""
        await self._put(name + SUFFIX, validator, size.to_bytes(_SIZE_BYTES, "little"))

    async def load_blocks(self, name: str, validator: str) -> Blocks:
        """The block counts kept as ``name`` under ``validator`` (none if none)."""
        data = await self._get(name + BLOCKS_SUFFIX, validator)
        if data is None or len(data) % BLOCK_RECORD.itemsize:
            return {}
        records = np.frombuffer(data, dtype=BLOCK_RECORD)
        return {(int(r["start"]), int(r["stop"])): (bytes(r["digest"]), int(r["count"]))
                for r in records}

    async def save_blocks(self, name: str, validator: str, blocks: Blocks) -> None:
        """Keep ``blocks`` as ``name`` under ``validator``."""
        records = np.array([(start, stop, digest, count)
                            for (start, stop), (digest, count) in blocks.items()],
                           dtype=BLOCK_RECORD)
        await self._put(name + BLOCKS_SUFFIX, validator, records.tobytes())

    async def _get(self, key: str, validator: str) -> bytes | None:
        kept: tuple[str, bytes] | None = self._memory.get(key)
        if kept is not None and kept[0] == validator:
            return kept[1]
        if self._disk is None:
            return None
        got = await self._disk.get(self._source, key, validator, 0)
        if got is None:
            return None
        data = bytes(got)
        self._remember(key, validator, data)
        return data

    async def _put(self, key: str, validator: str, data: bytes) -> None:
        self._remember(key, validator, data)
        if self._disk is not None:
            await self._disk.put(self._source, key, validator, 0, data)

    def _remember(self, key: str, validator: str, data: bytes) -> None:
        """Keep a record in memory, in place of the name's last."""
        self._memory.put(key, (validator, data), len(key) + len(data))


def _digest(*parts: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()
