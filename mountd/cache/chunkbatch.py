"""Reading many chunks of one dataset at once.

Owns how a batch of chunks is read (``read_chunks``) and how large a batch
is (``batch_size``). The dataset's chunk store reads the batch with its
``read_many``: HSDS with one ``fetch_many`` of the chunk objects (one
worker-thread call for a local bucket, concurrent gets for a remote one),
decoded together; a store with no batch read of its own with concurrent
``read`` calls (``layouts.model.read_each``). A batch is at most
``MAX_BATCH`` chunks and about ``BATCH_BYTES`` of decoded data, so a batch
of large chunks is one chunk and a batch of tiny ones pays one thread hop
for hundreds of chunks.

Concurrency: stateless; safe from any number of trio tasks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence

from layouts.model import ChunkIndex, Dataset
from mountd.cache.chunkcache import Outcome

#: Most chunks in one batch.
MAX_BATCH = 256
#: Decoded bytes of one batch, about (at least one chunk).
BATCH_BYTES = 256 << 10
#: What one chunk of a variable-length type counts as (its size is unknown).
VLEN_CHUNK_BYTES = 64 << 10


def chunk_bytes(ds: Dataset) -> int:
    """Decoded bytes of one chunk of ``ds`` (an estimate for variable-length types)."""
    return ds.chunk_nbytes or VLEN_CHUNK_BYTES


def batch_size(ds: Dataset) -> int:
    """How many chunks of ``ds`` one batch reads."""
    return max(1, min(MAX_BATCH, BATCH_BYTES // max(1, chunk_bytes(ds))))


async def read_chunks(ds: Dataset, indices: Sequence[ChunkIndex]) -> Sequence[Outcome]:
    """``ds.read_chunk`` of every index, in order: a chunk, None or the error."""
    return await ds.store.read_many(indices)


def fetcher(ds: Dataset) -> Callable[[list[Hashable]], Awaitable[Sequence[Outcome]]]:
    """The chunk cache's batch fetch for ``ds``, whose keys end with the chunk index."""
    async def fetch(keys: list[Hashable]) -> Sequence[Outcome]:
        return await read_chunks(ds, [key[-1] for key in keys])
    return fetch
