"""A ``Store`` over a local directory: key ``a/b`` is the file ``ROOT/a/b``.

Owns nothing but a root path and a thread limiter. Every blocking call (open,
read, stat, scandir) runs in ``trio.to_thread.run_sync`` under that limiter,
so a slow disk never stalls the trio loop. The calls only read, so a
cancelled call is abandoned rather than waited for: a hung disk cannot block
an unmount. Keys are checked so that none
escapes the root (no ``..``, no absolute paths). Every call is counted in
the process's ``local`` storage meter (``mountd.io.meter``), on the trio
thread.

Only regular files are read, as a bucket may be hostile: a FIFO would block
the open and a device (a symlink to ``/dev/zero``) would never end, so both
give ``StorageError``. A ranged read is cut at the size the file had when
opened, so a hostile length allocates no more than the file holds.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import trio

from layouts.storage import ByteRange, Fetched, Listing, ObjectInfo, too_large
from mountd.errors import Changed, MountError, NotFound, StorageError
from mountd.io.meter import STORES, measured

if TYPE_CHECKING:
    from os import _ScandirIterator

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Directory entries read per worker-thread call in ``iter_dir``.
DIR_PAGE = 1000
#: Directories scanned per worker-thread call in ``list_tree``.
TREE_BATCH = 256
#: Worker-thread calls of one ``list_tree`` under way at once. Two keep a cold
#: disk busy about as well as eight while the threads hardly contend for the
#: interpreter: listing a 100,000-object domain took 7.5 s wall and 8.0 CPU-s
#: cold, 2.0 and 2.6 warm, against 7.5 and 11.8, 4.3 and 5.8 with eight.
TREE_THREADS = 2


def _info(st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(size=st.st_size, etag=f"{st.st_mtime_ns:x}-{st.st_size:x}",
                      mtime=st.st_mtime)


def _open(key: str, path: str) -> tuple[BinaryIO, os.stat_result]:
    """The regular file at ``path`` opened for reading, and its stat; anything else
    raises (a directory ``IsADirectoryError``, a FIFO or device ``StorageError``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(key, "not a regular file")
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def _read(f: BinaryIO, st: os.stat_result, byte_range: ByteRange | None) -> bytes:
    """All of the open file ``f``, or ``byte_range`` of it cut at its size ``st``."""
    if byte_range is None:
        return f.read()
    f.seek(byte_range.start)
    room = max(st.st_size - byte_range.start, 0)
    return f.read(room if byte_range.length is None else min(byte_range.length, room))


class LocalStore:
    """Objects are files below ``root``; prefixes are directories."""

    def __init__(self, root: str | os.PathLike[str], threads: int = 8) -> None:
        self.root = Path(root).resolve()
        self._root = str(self.root)
        self._limiter = trio.CapacityLimiter(threads)
        self._tree_limiter = trio.CapacityLimiter(TREE_THREADS)

    @property
    def url(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if key.startswith("/") or ".." in parts or "." in parts:
            raise StorageError(key, "key is not inside the store")
        return os.path.join(self._root, *[p for p in parts if p])

    async def _run(self, key: str, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread, its OS errors mapped, counted in ``STORES["local"]``."""
        return await measured(STORES["local"], self._mapped(key, fn))

    async def _mapped(self, key: str, fn: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(fn, limiter=self._limiter,
                                                 abandon_on_cancel=True)
        except FileNotFoundError as exc:
            raise NotFound(key) from exc
        except NotADirectoryError as exc:
            raise NotFound(key) from exc
        except IsADirectoryError as exc:
            raise NotFound(key) from exc
        except OSError as exc:
            raise StorageError(key, os.strerror(exc.errno or errno.EIO)) from exc

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            f, st = _open(key, path)
            with f:
                return _read(f, st, byte_range)

        return await self._run(key, read)

    async def fetch_many(self, keys: Sequence[str],
                         limit: int | None = None) -> list[Fetched | MountError]:
        """Whole objects with their info, read one after another in one
        worker-thread call (a thread hop costs more than reading a small file
        from the page cache).

        With ``limit``, a file of more bytes gives ``Corrupt`` (``store.too_large``):
        known from its size before it is read, and no more than ``limit + 1``
        bytes are read should it grow meanwhile (nor allocated: a buffer of
        the size asked for is made before a read).
        """
        paths: list[str | MountError] = []
        for key in keys:
            try:
                paths.append(self._path(key))
            except StorageError as exc:
                paths.append(exc)

        def read_one(key: str, path: str) -> Fetched | MountError:
            f, st = _open(key, path)
            with f:
                if limit is None:
                    return Fetched(f.read(), _info(st))
                if st.st_size > limit:
                    return too_large(key, limit, st.st_size)
                data = f.read(st.st_size + 1)
                if len(data) > st.st_size:  # it grew since it was opened
                    data += f.read(limit + 1 - len(data))
                return too_large(key, limit) if len(data) > limit else Fetched(data, _info(st))

        def read_all() -> list[Fetched | MountError]:
            out: list[Fetched | MountError] = []
            for key, path in zip(keys, paths, strict=True):
                if isinstance(path, MountError):
                    out.append(path)
                    continue
                try:
                    out.append(read_one(key, path))
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    out.append(NotFound(key))
                except MountError as exc:
                    out.append(exc)
                except OSError as exc:
                    out.append(StorageError(key, os.strerror(exc.errno or errno.EIO)))
            return out

        meter = STORES["local"]
        meter.requests += len(keys)
        start = trio.current_time()
        try:
            results = await trio.to_thread.run_sync(read_all, limiter=self._limiter,
                                                    abandon_on_cancel=True)
        finally:
            meter.latency.add(trio.current_time() - start)
        for result in results:
            if isinstance(result, NotFound):
                meter.not_found += 1
            elif isinstance(result, MountError):
                meter.failures += 1
            else:
                meter.returned(result.data)
        return results

    async def fetch(self, key: str, byte_range: ByteRange | None = None,
                    if_match: str | None = None) -> Fetched:
        path = self._path(key)

        def read() -> Fetched:
            f, st = _open(key, path)
            with f:
                info = _info(st)
                if if_match is not None and info.etag != if_match:
                    raise Changed(key, f"changed (etag {info.etag}, expected {if_match})")
                return Fetched(_read(f, st, byte_range), info)

        return await self._run(key, read)

    async def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        st = await self._run(key, lambda: os.stat(path))
        if not os.path.isfile(path):
            raise NotFound(key)
        return _info(st)

    async def exists(self, key: str) -> bool:
        path = self._path(key)
        return await trio.to_thread.run_sync(os.path.isfile, path, limiter=self._limiter,
                                             abandon_on_cancel=True)

    async def list_dir(self, prefix: str) -> Listing:
        path = self._path(prefix)

        def scan() -> Listing:
            prefixes: list[str] = []
            keys: list[str] = []
            with os.scandir(path) as it:
                for entry in it:
                    if entry.is_dir():
                        prefixes.append(f"{prefix}{entry.name}/")
                    else:
                        keys.append(f"{prefix}{entry.name}")
            prefixes.sort()
            keys.sort()
            return Listing(prefixes, keys)

        return await self._run(prefix, scan)

    async def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        """Names under ``prefix`` in pages of ``DIR_PAGE``, one worker-thread
        call per page; the first call also opens the directory, and a short
        page is known to be the last, so a small directory costs one call."""
        path = self._path(prefix)

        def page(it: _ScandirIterator[str]) -> list[str]:
            names = []
            for entry in it:
                names.append(f"{prefix}{entry.name}/" if entry.is_dir()
                             else f"{prefix}{entry.name}")
                if len(names) == DIR_PAGE:
                    break
            return names

        def first() -> tuple[_ScandirIterator[str], list[str]]:
            it = os.scandir(path)
            try:
                return it, page(it)
            except BaseException:
                it.close()
                raise

        it, names = await self._run(prefix, first)
        try:
            while True:
                for name in names:
                    yield name
                if len(names) < DIR_PAGE:
                    return
                names = await self._run(prefix, lambda: page(it))
        finally:
            it.close()

    async def list_tree(self, prefix: str, info_for: Callable[[str], bool],
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        """Every file under ``prefix``, the ``stat`` of those ``info_for`` asks about.

        The tree is walked a level at a time; each level's directories are
        scanned in batches of ``TREE_BATCH``, one worker-thread call each,
        ``TREE_THREADS`` at once, so a cold disk has reads in flight while
        another thread parses what came back. Each call counts as one request.
        Symbolic links are not followed into directories.
        """
        out: list[tuple[str, ObjectInfo | None]] = []
        found: list[tuple[list[tuple[str, ObjectInfo | None]], list[tuple[str, str]]]] = []

        async def scan(batch: list[tuple[str, str]]) -> None:
            async with self._tree_limiter:
                found.append(await self._run(batch[0][1],
                                             lambda: self._scan_dirs(batch, info_for, limit)))

        level = [(self._path(prefix), prefix)]
        while level:
            found.clear()
            async with trio.open_nursery() as nursery:
                for i in range(0, len(level), TREE_BATCH):
                    nursery.start_soon(scan, level[i:i + TREE_BATCH])
            level = []
            for files, dirs in found:
                out.extend(files)
                level.extend(dirs)
            if len(out) > limit:
                return None
        return out

    @staticmethod
    def _scan_dirs(dirs: list[tuple[str, str]], info_for: Callable[[str], bool], limit: int
                   ) -> tuple[list[tuple[str, ObjectInfo | None]], list[tuple[str, str]]]:
        """The files (with the infos asked for) and subdirectories (their paths and
        key prefixes) of each of ``dirs`` (path, key prefix); one that is gone or
        not a directory has none. The paths are the store's own, joined from
        names a scan gave, so they need no check. Past ``limit`` files the scan
        stops (the listing is given up: a directory of a million chunks is not
        read whole)."""
        files: list[tuple[str, ObjectInfo | None]] = []
        subdirs: list[tuple[str, str]] = []
        for path, prefix in dirs:
            if len(files) > limit:
                break
            try:
                it = os.scandir(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                for entry in it:
                    if len(files) > limit:
                        break
                    name = entry.name
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append((entry.path, f"{prefix}{name}/"))
                        continue
                    key = prefix + name
                    if not info_for(key):
                        files.append((key, None))
                        continue
                    try:
                        files.append((key, _info(entry.stat())))
                    except FileNotFoundError:
                        continue
        return files, subdirs
