"""A ``Store`` over a local directory: key ``a/b`` is the file ``ROOT/a/b``.

Owns a root directory (a descriptor of it, opened at first use and held for
the store's life) and a thread limiter. Every blocking call (open, read,
stat, scandir) runs in ``trio.to_thread.run_sync`` under that limiter, so a
slow disk never stalls the trio loop. The calls only read, so a cancelled
call is abandoned rather than waited for: a hung disk cannot block an
unmount. Keys are checked so that none escapes the root (no ``..``, no
absolute paths). Every call is counted in the process's ``local`` storage
meter (``mountd.io.meter``), on the trio thread.

A bucket may be hostile, and the daemon often runs as root for other users
(``allow_other``), so it is read beneath its directory only
(``mountd.io.beneath``): no symbolic link inside it is followed, wherever it
is (``docs/CONTRACT.md``, "Errors"). The root itself may be a symlink (the
SOURCE is the user's choice); it is resolved once, when the store is made.
A key that is a symlink, or lies under one, gives ``StorageError`` naming
the link, from every call that takes a key (``exists`` too: a chunk looked
up by name must not pass for one that is not stored). Of the listings,
``list_dir`` (folders, partitions) leaves symlinks out, so the rest of a
folder lists; ``iter_dir`` (a dataset's chunks) and ``list_tree`` (a domain)
fail with that error instead, as leaving a chunk out would make it read as
its fill value. No listing descends into a symlink. Each link is logged
once, by ``report_once`` (the log-once rule of ``layouts.errors``),
whichever call met it. With ``follow_symlinks`` (for a reference file's
local refs, which name host paths anyway) opens follow symlinks as ``open``
does; listings treat them as above.

Only regular files are read: a FIFO would block the open and a device
would never end, so both give ``StorageError``. A ranged read is cut at the
size the file had when opened, so a hostile length allocates no more than
the file holds. ``stat`` is always ``fstat`` of the opened descriptor, or
of a directory entry without following it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import trio

from layouts.storage import ByteRange, Fetched, Listing, ObjectInfo, too_large
from mountd.errors import Changed, MountError, NotFound, StorageError, report_once
from mountd.io.beneath import SymlinkFound, open_beneath
from mountd.io.meter import STORES, measured

if TYPE_CHECKING:
    from os import DirEntry, _ScandirIterator

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
#: Why a symbolic link in the store is refused, as logged and raised.
NOT_FOLLOWED = ("a symbolic link, not followed: a local bucket is read beneath "
                "its directory only")
_READ = os.O_RDONLY | os.O_NONBLOCK
_LIST = os.O_RDONLY | os.O_DIRECTORY
_DIR, _LINK, _FILE = range(3)


def _info(st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(size=st.st_size, etag=f"{st.st_mtime_ns:x}-{st.st_size:x}",
                      mtime=st.st_mtime)


def _refused(link: str) -> StorageError:
    """The error for the symlink ``link`` (a key), logged the first time it is met."""
    err = StorageError(link, NOT_FOLLOWED)
    report_once(err)
    return err


def _kind(entry: DirEntry[str]) -> int:
    """``_DIR``, ``_LINK`` or ``_FILE`` (anything else) for a listing's entry, from
    the type its directory gives (no call, unless the file system has none)."""
    if entry.is_dir(follow_symlinks=False):
        return _DIR
    return _LINK if entry.is_symlink() else _FILE


def _read(f: BinaryIO, st: os.stat_result, byte_range: ByteRange | None) -> bytes:
    """All of the open file ``f``, or ``byte_range`` of it cut at its size ``st``."""
    if byte_range is None:
        return f.read()
    f.seek(byte_range.start)
    room = max(st.st_size - byte_range.start, 0)
    return f.read(room if byte_range.length is None else min(byte_range.length, room))


def _open_following(dir_fd: int, rel: str, flags: int) -> int:
    return os.open(rel, flags | os.O_CLOEXEC, dir_fd=dir_fd)


class LocalStore:
    """Objects are files below ``root``; prefixes are directories."""

    def __init__(self, root: str | os.PathLike[str], threads: int = 8, *,
                 follow_symlinks: bool = False) -> None:
        self.root = Path(root).resolve()
        self._root = str(self.root)
        self._opener = _open_following if follow_symlinks else open_beneath
        self._fd: int | None = None
        self._fd_lock = threading.Lock()
        self._limiter = trio.CapacityLimiter(threads)
        self._tree_limiter = trio.CapacityLimiter(TREE_THREADS)

    @property
    def url(self) -> str:
        return f"file://{self.root}"

    def _rel(self, key: str) -> str:
        """The path of ``key`` relative to the root (``.`` for the root itself)."""
        parts = key.split("/")
        if key.startswith("/") or ".." in parts or "." in parts:
            raise StorageError(key, "key is not inside the store")
        return "/".join(p for p in parts if p) or "."

    def _root_fd(self) -> int:
        """The root's descriptor, opened (following symlinks: the SOURCE may be one)
        at the first call that finds it; in a worker thread."""
        with self._fd_lock:
            if self._fd is None:
                self._fd = os.open(self._root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                weakref.finalize(self, os.close, self._fd)
            return self._fd

    def _open_fd(self, rel: str, flags: int) -> int:
        """A descriptor of ``rel`` below the root; a symlink on the way is
        ``StorageError`` naming it (``_refused``)."""
        try:
            return self._opener(self._root_fd(), rel, flags)
        except SymlinkFound as found:
            raise _refused(found.where) from None

    def _open(self, key: str, rel: str) -> tuple[BinaryIO, os.stat_result]:
        """The regular file ``rel`` (of ``key``) opened for reading, and its stat;
        anything else raises (a directory ``IsADirectoryError``, a FIFO or
        device ``StorageError``)."""
        fd = self._open_fd(rel, _READ)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(key, "not a regular file")
            return os.fdopen(fd, "rb"), st
        except BaseException:
            os.close(fd)
            raise

    def _stat(self, rel: str) -> os.stat_result:
        """``fstat`` of ``rel``, opened without reading it (``O_PATH``)."""
        fd = self._open_fd(rel, os.O_PATH)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _scandir(self, rel: str) -> tuple[int, _ScandirIterator[str]]:
        """The directory ``rel`` opened, and a scan of it: close both."""
        fd = self._open_fd(rel, _LIST)
        try:
            return fd, os.scandir(fd)
        except BaseException:
            os.close(fd)
            raise

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
        rel = self._rel(key)

        def read() -> bytes:
            f, st = self._open(key, rel)
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
        rels: list[str | MountError] = []
        for key in keys:
            try:
                rels.append(self._rel(key))
            except StorageError as exc:
                rels.append(exc)

        def read_one(key: str, rel: str) -> Fetched | MountError:
            f, st = self._open(key, rel)
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
            for key, rel in zip(keys, rels, strict=True):
                if isinstance(rel, MountError):
                    out.append(rel)
                    continue
                try:
                    out.append(read_one(key, rel))
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
        rel = self._rel(key)

        def read() -> Fetched:
            f, st = self._open(key, rel)
            with f:
                info = _info(st)
                if if_match is not None and info.etag != if_match:
                    raise Changed(key, f"changed (etag {info.etag}, expected {if_match})")
                return Fetched(_read(f, st, byte_range), info)

        return await self._run(key, read)

    async def head(self, key: str) -> ObjectInfo:
        rel = self._rel(key)
        st = await self._run(key, lambda: self._stat(rel))
        if not stat.S_ISREG(st.st_mode):
            raise NotFound(key)
        return _info(st)

    async def exists(self, key: str) -> bool:
        """True for a regular file, False for anything else or nothing; a symlink
        on the way is ``StorageError``, as for a read."""
        rel = self._rel(key)

        def is_file() -> bool:
            try:
                return stat.S_ISREG(self._stat(rel).st_mode)
            except OSError:
                return False

        return await trio.to_thread.run_sync(is_file, limiter=self._limiter,
                                             abandon_on_cancel=True)

    async def list_dir(self, prefix: str) -> Listing:
        rel = self._rel(prefix)

        def scan() -> Listing:
            prefixes: list[str] = []
            keys: list[str] = []
            fd, it = self._scandir(rel)
            try:
                for entry in it:
                    kind = _kind(entry)
                    if kind == _DIR:
                        prefixes.append(f"{prefix}{entry.name}/")
                    elif kind == _FILE:
                        keys.append(f"{prefix}{entry.name}")
                    else:
                        _refused(prefix + entry.name)
            finally:
                it.close()
                os.close(fd)
            prefixes.sort()
            keys.sort()
            return Listing(prefixes, keys)

        return await self._run(prefix, scan)

    async def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        """Names under ``prefix`` in pages of ``DIR_PAGE``, one worker-thread
        call per page; the first call also opens the directory, and a short
        page is known to be the last, so a small directory costs one call.
        A symlink in the directory fails the listing (``_refused``)."""
        rel = self._rel(prefix)

        def page(it: _ScandirIterator[str]) -> list[str]:
            names = []
            for entry in it:
                kind = _kind(entry)
                if kind == _LINK:
                    raise _refused(prefix + entry.name)
                names.append(f"{prefix}{entry.name}/" if kind == _DIR
                             else f"{prefix}{entry.name}")
                if len(names) == DIR_PAGE:
                    break
            return names

        def first() -> tuple[int, _ScandirIterator[str], list[str]]:
            fd, it = self._scandir(rel)
            try:
                return fd, it, page(it)
            except BaseException:
                it.close()
                os.close(fd)
                raise

        fd, it, names = await self._run(prefix, first)
        try:
            while True:
                for name in names:
                    yield name
                if len(names) < DIR_PAGE:
                    return
                names = await self._run(prefix, lambda: page(it))
        finally:
            it.close()
            os.close(fd)

    async def list_tree(self, prefix: str, info_for: Callable[[str], bool],
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        """Every file under ``prefix``, the ``stat`` of those ``info_for`` asks about.

        The tree is walked a level at a time; each level's directories are
        scanned in batches of ``TREE_BATCH``, one worker-thread call each,
        ``TREE_THREADS`` at once, so a cold disk has reads in flight while
        another thread parses what came back. Each call counts as one request.
        A symbolic link anywhere under ``prefix`` fails the listing with
        ``StorageError`` naming it: left out, it would read as a key that
        is not stored (a chunk as its fill value). The first error a scan
        raises stops the others and is raised itself (not in a group).
        """
        out: list[tuple[str, ObjectInfo | None]] = []
        found: list[tuple[list[tuple[str, ObjectInfo | None]], list[tuple[str, str]]]] = []
        failed: list[MountError] = []

        async def scan(batch: list[tuple[str, str]], scope: trio.CancelScope) -> None:
            async with self._tree_limiter:
                try:
                    found.append(await self._run(
                        batch[0][1], lambda: self._scan_dirs(batch, info_for, limit)))
                except MountError as exc:
                    failed.append(exc)
                    scope.cancel()

        level = [(self._rel(prefix), prefix)]
        while level:
            found.clear()
            async with trio.open_nursery() as nursery:
                for i in range(0, len(level), TREE_BATCH):
                    nursery.start_soon(scan, level[i:i + TREE_BATCH], nursery.cancel_scope)
            if failed:
                raise failed[0]
            level = []
            for files, dirs in found:
                out.extend(files)
                level.extend(dirs)
            if len(out) > limit:
                return None
        return out

    def _scan_dirs(self, dirs: list[tuple[str, str]], info_for: Callable[[str], bool],
                   limit: int
                   ) -> tuple[list[tuple[str, ObjectInfo | None]], list[tuple[str, str]]]:
        """The files (with the infos asked for) and subdirectories (their paths
        and key prefixes) of each of ``dirs`` (path below the root, key prefix);
        one that is gone or not a directory has none. The paths are the store's
        own, joined from names a scan gave, so they need no check. Past
        ``limit`` files the scan stops (the listing is given up: a directory of
        a million chunks is not read whole). A symlink raises ``StorageError``
        (``_refused``)."""
        files: list[tuple[str, ObjectInfo | None]] = []
        subdirs: list[tuple[str, str]] = []
        for rel, prefix in dirs:
            if len(files) > limit:
                break
            try:
                fd, it = self._scandir(rel)
            except (FileNotFoundError, NotADirectoryError):
                continue
            base = "" if rel == "." else rel + "/"
            try:
                for entry in it:
                    if len(files) > limit:
                        break
                    name = entry.name
                    kind = _kind(entry)
                    if kind == _DIR:
                        subdirs.append((base + name, f"{prefix}{name}/"))
                        continue
                    if kind == _LINK:
                        raise _refused(prefix + name)
                    key = prefix + name
                    if not info_for(key):
                        files.append((key, None))
                        continue
                    try:
                        files.append((key, _info(entry.stat(follow_symlinks=False))))
                    except FileNotFoundError:
                        continue
            finally:
                it.close()
                os.close(fd)
        return files, subdirs
