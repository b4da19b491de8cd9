"""A minimal pyfuse3 filesystem serving one file from memory: the benchmark's Python FUSE limit.

This module owns peer (e) of ``bench.bench_npy``: a read-only FUSE filesystem
whose root holds a single file, ``data.bin``, backed by one ``bytes`` object;
``read`` returns a slice of it. Nothing else is done per request, so reading
the file measures what the kernel plus pyfuse3 plus trio can deliver here.
Files are opened without ``keep_cache``, so every ``open`` starts from an
empty page cache and every read of the file goes through FUSE.

It counts the read requests the kernel sends (by size) and, on unmount,
writes those counts as JSON to ``--stats`` when given.

Run ``python -m bench.memfs MOUNTPOINT [--size BYTES] [--stats FILE]``; it stays
in the foreground until ``fusermount3 -u MOUNTPOINT``.
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import logging
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path

import pyfuse3
import trio

log = logging.getLogger("bench.memfs")

FILE_NAME = b"data.bin"
FILE_INODE = pyfuse3.ROOT_INODE + 1
DEFAULT_SIZE = 1 << 30


class Served(pyfuse3.Operations):
    """What ``serve_until_unmounted`` needs of a filesystem: its request statistics."""

    def stats(self) -> dict[str, object]:
        raise NotImplementedError


#: h5mount's default ``metadata_ttl``: the entry and attribute timeouts of the tree peers.
TIMEOUT = 60.0
#: The one xattr namespace h5mount answers in (ENOTSUP outside it).
XATTR_NAMESPACE = b"user."


class TreePeer(Served):
    """What the read-only tree peers (``bench.memtree``, ``bench.memdir``) share:
    request counts by type and of the entries ``readdir`` handed over, the
    owner of every entry, ``getattr`` through ``_attrs``, ``forget`` and
    ``releasedir`` that only count (inodes are fixed), and xattrs answered as
    h5mount answers them (ENOTSUP outside ``user.``, else ENODATA; none listed).
    Its handlers await nothing, so the counters need no lock."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self) -> None:
        super().__init__()
        self.requests: collections.Counter[str] = collections.Counter()
        self.readdir_entries = 0
        self._uid = os.getuid()
        self._gid = os.getgid()

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        raise NotImplementedError

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        self.requests["forget"] += 1

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext
                      ) -> pyfuse3.EntryAttributes:
        self.requests["getattr"] += 1
        return self._attrs(inode)

    async def releasedir(self, fh: int) -> None:
        self.requests["releasedir"] += 1

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        self.requests["getxattr"] += 1
        if not name.startswith(XATTR_NAMESPACE):
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        self.requests["listxattr"] += 1
        return []

    def stats(self) -> dict[str, object]:
        """Requests seen so far by type, and the entries ``readdir`` handed to the kernel."""
        return {
            "requests": dict(sorted(self.requests.items())),
            "total": sum(self.requests.values()),
            "readdir_entries": self.readdir_entries,
        }


class MemFS(Served):
    """Root directory with one read-only file whose content is ``data``."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data
        self.read_sizes: collections.Counter[int] = collections.Counter()
        self.read_bytes = 0
        self._uid = os.getuid()
        self._gid = os.getgid()
        self._time_ns = time.time_ns()

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        if inode == pyfuse3.ROOT_INODE:
            entry.st_mode = stat.S_IFDIR | 0o555
            entry.st_nlink = 2
            entry.st_size = 0
        elif inode == FILE_INODE:
            entry.st_mode = stat.S_IFREG | 0o444
            entry.st_nlink = 1
            entry.st_size = len(self.data)
        else:
            raise pyfuse3.FUSEError(errno.ENOENT)
        entry.st_uid = self._uid
        entry.st_gid = self._gid
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = self._time_ns
        entry.st_blksize = 4096
        entry.st_blocks = (entry.st_size + 511) // 512
        entry.attr_timeout = 3600.0
        entry.entry_timeout = 3600.0
        return entry

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None
                      ) -> pyfuse3.EntryAttributes:
        return self._attrs(inode)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        if parent_inode != pyfuse3.ROOT_INODE or name != FILE_NAME:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(FILE_INODE)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        if start_id == 0:
            pyfuse3.readdir_reply(token, FILE_NAME, self._attrs(FILE_INODE), 1)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext
                   ) -> pyfuse3.FileInfo:
        if inode != FILE_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        return pyfuse3.FileInfo(fh=inode, keep_cache=False)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        self.read_sizes[size] += 1
        chunk = self.data[off:off + size]
        self.read_bytes += len(chunk)
        return chunk

    async def release(self, fh: int) -> None:
        return None

    def stats(self) -> dict[str, object]:
        """Read requests seen so far: total count, bytes, and count per request size."""
        return {
            "requests": sum(self.read_sizes.values()),
            "bytes": self.read_bytes,
            "by_size": {str(k): v for k, v in sorted(self.read_sizes.items())},
        }


def make_data(size: int) -> bytes:
    """``size`` bytes of a repeating 0..255 pattern (content does not matter, only speed)."""
    pattern = bytes(range(256)) * 4096
    reps, rest = divmod(size, len(pattern))
    return pattern * reps + pattern[:rest]


def serve_until_unmounted(ops: Served, mountpoint: Path, options: set[str],
                          stats_file: Path | None) -> None:
    """Mount ``ops``, serve until unmounted, then write its statistics to ``stats_file``."""
    pyfuse3.init(ops, str(mountpoint), options)
    try:
        trio.run(pyfuse3.main)
    except BaseException:
        pyfuse3.close(unmount=True)
        raise
    pyfuse3.close(unmount=False)
    if stats_file is not None:
        stats_file.write_text(json.dumps(ops.stats(), indent=2) + "\n")
    log.info("%s unmounted; %s", mountpoint, ops.stats())


def serve(mountpoint: Path, size: int, stats_file: Path | None) -> None:
    """Mount, serve until unmounted, then write the request statistics."""
    ops = MemFS(make_data(size))
    log.info("memfs: serving %d bytes at %s", size, mountpoint)
    serve_until_unmounted(ops, mountpoint, {*pyfuse3.default_options, "fsname=h5bench-memfs",
                                            "ro"}, stats_file)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.memfs MOUNTPOINT [--size N] [--stats FILE]``."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--stats", type=Path, default=None,
                        help="write read-request statistics (JSON) here on unmount")
    parser.add_argument("--log-level", default="WARNING", type=str.upper)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    serve(args.mountpoint, args.size, args.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
