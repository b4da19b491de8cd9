"""A bare pyfuse3 filesystem holding one big directory: the peer for directory listings.

This module owns the listing peer of ``bench.bench_meta``: a read-only FUSE
filesystem whose root holds one directory, ``dir/``, of N entries computed
from their position (nothing is stored per entry), so listing it measures
what the kernel plus pyfuse3 plus trio deliver here for ``ls -l``:

- ``--shape group`` (default): N links shaped like an h5mount group, i.e.
  ``3 * N`` entries: for each link ``i`` an empty directory ``d%06d``, a file
  ``d%06d.json`` (300 bytes) and a file ``d%06d.npy`` (144 bytes);
- ``--shape chunks``: N files ``0`` .. ``N-1`` of 4 bytes, like a dataset's
  chunk directory.

Files have sizes but no content (they cannot be opened). ``readdir`` replies
with full attributes (readdirplus) and stable offsets (position + 1); inodes
are fixed (root 1, ``dir`` 2, entry at position ``p`` is ``p + 3``), so the
kernel's lookup counts need no tracking and ``forget`` only counts. Entry
and attribute timeouts are 60 s, h5mount's default ``metadata_ttl``; xattrs
answer as h5mount's do (ENOTSUP outside ``user.``, else ENODATA; none listed).

It counts the requests it gets by type and, on unmount, writes them as JSON
to ``--stats`` when given.

Concurrency: pyfuse3 runs handlers as concurrent trio tasks; no handler
awaits anything, so each runs to completion and the counters need no lock.

Run ``python -m bench.memdir MOUNTPOINT --entries N [--shape group|chunks]
[--stats FILE]``; it stays in the foreground until ``fusermount3 -u MOUNTPOINT``.
"""

from __future__ import annotations

import argparse
import errno
import logging
import re
import stat
import time
from pathlib import Path

import pyfuse3

from bench.memfs import TIMEOUT, TreePeer, serve_until_unmounted

log = logging.getLogger("bench.memdir")

DIR_NAME = b"dir"
DIR_INODE = pyfuse3.ROOT_INODE + 1
FIRST_ENTRY_INODE = DIR_INODE + 1
SHAPES = ("group", "chunks")
#: (suffix, is a directory, size) of the three entries of one link, in listing order.
GROUP_KINDS = ((b"", True, 0), (b".json", False, 300), (b".npy", False, 144))
CHUNK_SIZE = 4
_GROUP_NAME = re.compile(rb"d(\d{6})(|\.json|\.npy)")
_CHUNK_NAME = re.compile(rb"0|[1-9]\d*")
_KIND_OF_SUFFIX = {suffix: kind for kind, (suffix, _, _) in enumerate(GROUP_KINDS)}


class MemDir(TreePeer):
    """Root with ``dir/``, whose entries are computed from their position."""

    def __init__(self, entries: int, shape: str) -> None:
        super().__init__()
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
        self.links = entries
        self.shape = shape
        self.total = 3 * entries if shape == "group" else entries
        self._time_ns = time.time_ns()

    # -- the tree -------------------------------------------------------

    def _name(self, pos: int) -> bytes:
        if self.shape == "chunks":
            return b"%d" % pos
        return b"d%06d" % (pos // 3) + GROUP_KINDS[pos % 3][0]

    def _position(self, name: bytes) -> int:
        """The position of entry ``name`` in ``dir/``; ENOENT if there is none."""
        if self.shape == "chunks":
            if _CHUNK_NAME.fullmatch(name) and int(name) < self.total:
                return int(name)
        else:
            match = _GROUP_NAME.fullmatch(name)
            if match and int(match[1]) < self.links:
                return 3 * int(match[1]) + _KIND_OF_SUFFIX[match[2]]
        raise pyfuse3.FUSEError(errno.ENOENT)

    def _is_dir(self, inode: int) -> bool:
        if inode in (pyfuse3.ROOT_INODE, DIR_INODE):
            return True
        pos = inode - FIRST_ENTRY_INODE
        return self.shape == "group" and 0 <= pos < self.total and GROUP_KINDS[pos % 3][1]

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        pos = inode - FIRST_ENTRY_INODE
        if inode not in (pyfuse3.ROOT_INODE, DIR_INODE) and not 0 <= pos < self.total:
            raise pyfuse3.FUSEError(errno.ENOENT)
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        if self._is_dir(inode):
            entry.st_mode = stat.S_IFDIR | 0o555
            entry.st_nlink = 2
            entry.st_size = 0
        else:
            entry.st_mode = stat.S_IFREG | 0o444
            entry.st_nlink = 1
            entry.st_size = CHUNK_SIZE if self.shape == "chunks" else GROUP_KINDS[pos % 3][2]
        entry.st_uid = self._uid
        entry.st_gid = self._gid
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = self._time_ns
        entry.st_blksize = 4096
        entry.st_blocks = (entry.st_size + 511) // 512
        entry.attr_timeout = TIMEOUT
        entry.entry_timeout = TIMEOUT
        return entry

    # -- handlers -------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.requests["lookup"] += 1
        if parent_inode == pyfuse3.ROOT_INODE and name == DIR_NAME:
            return self._attrs(DIR_INODE)
        if parent_inode == DIR_INODE:
            return self._attrs(self._position(name) + FIRST_ENTRY_INODE)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        self.requests["opendir"] += 1
        if not self._is_dir(inode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        self.requests["readdir"] += 1
        if fh == pyfuse3.ROOT_INODE:
            if start_id == 0 and pyfuse3.readdir_reply(token, DIR_NAME,
                                                       self._attrs(DIR_INODE), 1):
                self.readdir_entries += 1
            return
        if fh != DIR_INODE:
            return  # a link's directory is empty
        for pos in range(start_id, self.total):
            inode = pos + FIRST_ENTRY_INODE
            if not pyfuse3.readdir_reply(token, self._name(pos), self._attrs(inode), pos + 1):
                break
            self.readdir_entries += 1


def serve(mountpoint: Path, entries: int, shape: str, stats_file: Path | None) -> None:
    """Mount, serve until unmounted, then write the request counts."""
    ops = MemDir(entries, shape)
    log.info("memdir: %d entries (%s) in dir/ at %s", ops.total, shape, mountpoint)
    serve_until_unmounted(ops, mountpoint, {*pyfuse3.default_options, "fsname=h5bench-memdir",
                                            "ro", "default_permissions"}, stats_file)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.memdir MOUNTPOINT --entries N [--shape S] [--stats F]``."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--entries", type=int, required=True,
                        help="links (group: 3 entries each) or files (chunks) in dir/")
    parser.add_argument("--shape", choices=SHAPES, default="group")
    parser.add_argument("--stats", type=Path, default=None,
                        help="write request counts (JSON) here on unmount")
    parser.add_argument("--log-level", default="WARNING", type=str.upper)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    serve(args.mountpoint, args.entries, args.shape, args.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
