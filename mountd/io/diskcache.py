"""The persistent block cache on disk (``-o cache_dir=DIR``, ``-o disk_cache_size=SIZE``).

Owns the files below ``DIR/v2/`` and an in-memory index of them. Each block
is one file ``HH/OBJECT-INDEX-ETAG``: OBJECT hashes the store URL and the key
the block came from (HH is its first two digits, to keep directories small),
INDEX is the block index and ETAG hashes the etag the block belongs to. A
file holds a header (magic, CRC32 and length of the data, length of the
meta), the meta (JSON ``[url, key, etag, index]``), zeros up to the next
multiple of ``mountd.io.direct.ALIGN``, and the data, which is therefore read
around the page cache straight into the caller's buffer (``O_DIRECT``,
``mountd.io.direct``): the memory caches hold those bytes already. The CRC32
is zlib's, computed by libdeflate (``deflate.crc32``): 6 GiB/s on the 2-core
test VM, where ``zlib.crc32`` (zlib 1.2.13) does 0.6 GiB/s and capped reads
from the cache below that. libdeflate holds the GIL meanwhile (0.7 ms per
4 MiB), which costs less than a core busy ten times as long.

- The index is rebuilt at start-up (``load``, run once on first use) by
  scanning the directory in a worker thread: names and sizes only, no reads.
  The LRU order comes from the files' mtimes, which a hit touches, so it
  survives a remount. Any other file below ``v2/`` (a temporary file left by
  a crash) is removed, and so is the directory of an older layout
  (``OLD_FORMATS``).
- ``get`` takes the etag the caller has validated: a block of another etag is
  stale, a miss, and removed. A file whose header, meta, length or CRC does
  not match is corrupt, a miss, and removed.
- Writes go to a temporary file renamed over the block, without fsync: after
  a crash or power loss there is no file, or a whole one, or one whose CRC
  fails; a half block is never served.
- At most ``size`` bytes of files (headers included); the least recently
  used blocks go first.
- Free space: a write never leaves the file system with less than
  max(5 % of its size, 1 GiB) free. 5 % is what ext4 keeps back for root by
  default, and the 1 GiB floor keeps a small disk from being filled to the
  brim. A write that would cross the line first evicts this cache's own
  least recently used blocks to make room; if the cache holds too little to
  make room, the block is not written.

Concurrency: the index, ``used`` and the counters live in the trio thread
and change only in sections with no ``await``: the lookup and LRU touch in
``get``; in ``put``, taking out the old entry and choosing the victims
before the write, and the insert after it. Every file operation runs in a
worker thread under the cache's own ``CapacityLimiter``. A block evicted
while another thread reads it is either read whole (an open file outlives
its unlink) or not found (a miss); a rename is atomic, so a reader sees the
old file, the new one or none. Bytes being written count against the free
space each writer checks, so concurrent writes do not overshoot it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import deflate
import trio

from mountd.io.direct import aligned, open_direct, read_into

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Layout version: the subdirectory of ``cache_dir`` the files live in.
FORMAT = "v2"
#: Subdirectories of earlier layouts, removed at start-up.
OLD_FORMATS = ("v1",)
MAGIC = b"h5mblk02"
#: magic, CRC32 of the data, data length, meta length
_HEADER = struct.Struct("<8sIQI")
#: Keep at least this part of the file system free ...
MIN_FREE_RATIO = 0.05
#: ... and at least this many bytes.
MIN_FREE_BYTES = 1 << 30
_OBJECT_DIGITS = 32
_ETAG_DIGITS = 16

IndexKey = tuple[str, int]


class _Queue(Protocol):
    """A write-behind queue (``mountd.io.writebehind.WriteBehind``)."""

    async def drain(self) -> None: ...


def disk_free(path: str) -> tuple[int, int]:
    """Bytes free for unprivileged users, and all bytes, of the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


@dataclass(slots=True)
class DiskStats:
    """Blocks found, not found, found with another etag, found broken, written, evicted,
    and not written for lack of free space."""

    hits: int = 0
    misses: int = 0
    stale: int = 0
    corrupt: int = 0
    writes: int = 0
    evictions: int = 0
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    size: int


def _digest(text: str, digits: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:digits]


def _parse(name: str) -> IndexKey | None:
    """The index key of a block file name, or None if ``name`` is not one."""
    parts = name.split("-")
    if len(parts) != 3:
        return None
    obj, index, etag = parts
    if (len(obj) != _OBJECT_DIGITS or len(etag) != _ETAG_DIGITS or not index.isdigit()
            or not all(c in "0123456789abcdef" for c in obj + etag)):
        return None
    return obj, int(index)


class DiskCache:
    """Blocks below ``root`` validated by etag, at most ``size`` bytes of files."""

    def __init__(self, root: str | os.PathLike[str], size: int, *, threads: int = 4,
                 free_space: Callable[[str], tuple[int, int]] = disk_free,
                 min_free_ratio: float = MIN_FREE_RATIO,
                 min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self.root = Path(root) / FORMAT
        self.size = size
        self.used = 0
        self.stats = DiskStats()
        self._free_space = free_space
        self._min_free_ratio = min_free_ratio
        self._min_free_bytes = min_free_bytes
        self._limiter = trio.CapacityLimiter(threads)
        self._index: OrderedDict[IndexKey, _Entry] = OrderedDict()
        self._loaded = False
        self._loading: trio.Event | None = None
        self._writing = 0
        self._warned = False
        self._queues: list[_Queue] = []

    def add_queue(self, queue: _Queue) -> None:
        """A write-behind queue that writes here: ``settle`` waits for it."""
        self._queues.append(queue)

    async def settle(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the queues' writes; whether all ended."""
        with trio.move_on_after(timeout):
            for queue in self._queues:
                await queue.drain()
            return True
        return False

    def _key(self, url: str, key: str, index: int) -> IndexKey:
        return _digest(f"{url}\0{key}", _OBJECT_DIGITS), index

    def _name(self, ik: IndexKey, etag: str) -> str:
        obj, index = ik
        return f"{obj[:2]}/{obj}-{index}-{_digest(etag, _ETAG_DIGITS)}"

    async def _run(self, fn: Callable[[], T], abandon: bool = True) -> T:
        return await trio.to_thread.run_sync(fn, limiter=self._limiter,
                                             abandon_on_cancel=abandon)

    # -- the index -----------------------------------------------------------------------

    async def load(self) -> None:
        """Build the index by scanning the directory, once; waits for a scan under way."""
        while not self._loaded:
            if self._loading is not None:
                await self._loading.wait()
                continue
            self._loading = trio.Event()
            try:
                found = await self._run(self._scan)
            except OSError as exc:
                log.warning("disk cache %s cannot be used: %s", self.root, exc)
                self.size = 0
                found = []
            finally:  # cancelled: not loaded, the next caller scans again
                event, self._loading = self._loading, None
                event.set()
            # No await from here to the unlink.
            victims = []
            for _, ik, name, size in found:
                old = self._index.pop(ik, None)
                if old is not None:  # an older version of the same block
                    self.used -= old.size
                    victims.append(old.name)
                self._index[ik] = _Entry(name, size)
                self.used += size
            victims += self._evict(self.size)
            self._loaded = True
            log.info("disk cache %s: %d blocks, %d bytes", self.root, len(self._index),
                     self.used)
            await self._unlink(victims)

    def _scan(self) -> list[tuple[int, IndexKey, str, int]]:
        """(mtime, index key, name, size) of every block file, oldest first; removes the
        rest, and the directories of older layouts."""
        for old in OLD_FORMATS:
            path = self.root.parent / old
            if path.is_dir() and not path.is_symlink():
                log.info("disk cache: removing %s, written by an earlier version", path)
                shutil.rmtree(path, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        found = []
        with os.scandir(self.root) as subdirs:
            for sub in subdirs:
                if not sub.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(sub.path) as entries:
                    for entry in entries:
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        ik = _parse(entry.name)
                        if ik is None:
                            Path(entry.path).unlink(missing_ok=True)
                            continue
                        st = entry.stat(follow_symlinks=False)
                        found.append((st.st_mtime_ns, ik, f"{sub.name}/{entry.name}",
                                      st.st_size))
        found.sort()
        return found

    def has_any(self, url: str, key: str, indices: Iterable[int]) -> bool:
        """True if some version of any of these blocks is on disk (once loaded; no I/O)."""
        obj, _ = self._key(url, key, 0)
        return any((obj, i) in self._index for i in indices)

    def _evict(self, target: int) -> list[str]:
        """Take least recently used entries out until at most ``target`` bytes are left."""
        victims = []
        while self.used > target and self._index:
            _, entry = self._index.popitem(last=False)
            self.used -= entry.size
            victims.append(entry.name)
            self.stats.evictions += 1
        return victims

    def _drop(self, ik: IndexKey, entry: _Entry) -> list[str]:
        """Take ``entry`` out unless it was replaced meanwhile; the file names to remove."""
        if self._index.get(ik) is not entry:
            return []
        del self._index[ik]
        self.used -= entry.size
        return [entry.name]

    async def _unlink(self, names: list[str]) -> None:
        if not names:
            return

        def unlink() -> None:
            for name in names:
                (self.root / name).unlink(missing_ok=True)

        try:
            await self._run(unlink)
        except OSError as exc:
            log.debug("disk cache: cannot remove a block: %s", exc)

    # -- reading -------------------------------------------------------------------------

    async def get(self, url: str, key: str, etag: str, index: int,
                  into: Callable[[int], bytearray | memoryview] | None = None
                  ) -> bytes | bytearray | memoryview | None:
        """The block if it is on disk with ``etag``, else None. Never raises but Cancelled.
        With ``into``, the block is read into ``into(length)`` (a decoded chunk into the
        chunk cache's own buffer, ``layouts.decoding.OUTPUT``), else it is ``bytes``."""
        await self.load()
        ik = self._key(url, key, index)
        entry = self._index.get(ik)
        if entry is None:
            self.stats.misses += 1
            return None
        if entry.name != self._name(ik, etag):
            self.stats.stale += 1
            self.stats.misses += 1
            await self._unlink(self._drop(ik, entry))
            return None
        self._index.move_to_end(ik)
        try:
            data = await self._run(partial(self._read, entry.name, _meta(url, key, etag, index),
                                           into))
        except FileNotFoundError:  # evicted meanwhile, or removed by someone else
            self._drop(ik, entry)
            self.stats.misses += 1
            return None
        except OSError as exc:
            log.debug("disk cache: cannot read %s: %s", entry.name, exc)
            data = None
        if data is None:
            log.debug("disk cache: removing broken block %s of %s%s", index, url, key)
            self.stats.corrupt += 1
            self.stats.misses += 1
            await self._unlink(self._drop(ik, entry))
            return None
        self.stats.hits += 1
        return data

    def _read(self, name: str, meta: bytes, into: Callable[[int], bytearray | memoryview] | None
              ) -> bytes | bytearray | memoryview | None:
        """The data of a block file (in ``into(length)`` if given), or None if it is not
        the block ``meta`` describes."""
        path = self.root / name
        start = _data_start(len(meta))
        fd = open_direct(path)
        try:
            head = bytearray(start)
            if read_into(fd, head, 0) != start:
                return None
            magic, crc, length, meta_len = _HEADER.unpack_from(head)
            if (magic != MAGIC or meta_len != len(meta)
                    or head[_HEADER.size:_HEADER.size + meta_len] != meta
                    or os.fstat(fd).st_size != start + length):
                return None
            data: bytearray | memoryview = bytearray(length) if into is None else into(length)
            if read_into(fd, data, start) != length:
                return None
        finally:
            os.close(fd)
        if deflate.crc32(data) != crc:
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU order that a remount reads back
        return bytes(data) if into is None else data

    # -- writing -------------------------------------------------------------------------

    async def put(self, url: str, key: str, etag: str, index: int,
                  data: bytes | memoryview) -> None:
        """Keep one block. Never raises but Cancelled: a cache that cannot write keeps less."""
        await self.load()
        ik = self._key(url, key, index)
        name = self._name(ik, etag)
        meta = _meta(url, key, etag, index)
        head = _HEADER.pack(MAGIC, deflate.crc32(data), len(data), len(meta)) + meta
        head += bytes(_data_start(len(meta)) - len(head))
        size = len(head) + len(data)
        if size > self.size:
            return
        # No await from here to the write.
        victims = []
        old = self._index.pop(ik, None)
        if old is not None:  # another version, or this one if it failed to read
            self.used -= old.size
            victims.append(old.name)
        victims += self._evict(self.size - size - self._writing)
        others = self._writing
        self._writing += size
        write = partial(self._write, name, head, data, others)
        try:
            short = await self._run(partial(write, victims), abandon=False)
            if 0 < short <= self.used:
                short = await self._run(partial(write, self._evict(self.used - short)),
                                        abandon=False)
        except OSError as exc:
            if self._warned:
                log.debug("disk cache: cannot write %s: %s", name, exc)
            else:
                log.warning("disk cache: cannot write %s: %s", name, exc)
                self._warned = True
            return
        finally:
            self._writing -= size
        if short > 0:
            log.debug("disk cache: not writing, %d bytes short of the free space to leave",
                      short)
            self.stats.skipped += 1
            return
        # No await from here to the unlink.
        victims = []
        prev = self._index.pop(ik, None)
        if prev is not None:  # written by a concurrent put meanwhile
            self.used -= prev.size
            if prev.name != name:
                victims.append(prev.name)
        self._index[ik] = _Entry(name, size)
        self.used += size
        self.stats.writes += 1
        victims += self._evict(self.size)
        await self._unlink(victims)

    def _write(self, name: str, head: bytes, data: bytes | memoryview, others: int,
               victims: list[str]) -> int:
        """Remove ``victims``, then write the block unless that would leave too little free
        space; 0 if written, else how many bytes short of the free space to leave."""
        for victim in victims:
            (self.root / victim).unlink(missing_ok=True)
        free, total = self._free_space(str(self.root))
        reserve = max(int(total * self._min_free_ratio), self._min_free_bytes)
        short = reserve - (free - others - len(head) - len(data))
        if short > 0:
            return short
        path = self.root / name
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return 0


def _data_start(meta_len: int) -> int:
    """Where the data of a block file starts, after its header and meta."""
    return aligned(_HEADER.size + meta_len)


def _meta(url: str, key: str, etag: str, index: int) -> bytes:
    return json.dumps([url, key, etag, index]).encode()
