"""A bare pyfuse3 filesystem serving a snapshot of a tree from memory: the peer of walks.

This module owns the walk peer of ``bench.bench_walk`` and the snapshot it serves:

- :func:`take` walks a directory (a warm h5mount mount of a domain) with
  ``os.scandir``, ``os.lstat`` and ``os.readlink`` and keeps, for every entry
  in readdir order, its name, mode, size, modification time, link count and
  symlink text; :func:`save` and :func:`load` write and read it as JSON;
- :class:`MemTree` serves a snapshot read-only: the mount's root holds one
  directory, the snapshot's top (named as it was, e.g. ``walk10k.h5``), and
  below it the same directories, names, sizes, modes, times and symlinks.
  ``readdir`` replies with full attributes (readdirplus) and stable offsets
  (position + 1); entry and attribute timeouts are 60 s, h5mount's default
  ``metadata_ttl``; xattrs answer as h5mount's do (ENOTSUP outside ``user.``,
  else ENODATA; none listed). Files have sizes but no content (they cannot
  be opened). Inodes are fixed (the root 1, entry ``i`` of the snapshot
  ``i + 2``), so the kernel's lookup counts need no tracking and ``forget``
  only counts.

So a walk over it measures what the kernel plus pyfuse3 plus trio deliver
for the same tree shape when no metadata has to be read. It counts the
requests it gets by type and, on unmount, writes them as JSON to ``--stats``.

Concurrency: pyfuse3 runs handlers as concurrent trio tasks; no handler
awaits anything, so each runs to completion and the tree and counters need
no lock. :func:`take` runs in the caller's thread.

Run ``python -m bench.memtree MOUNTPOINT --snapshot FILE [--stats FILE]`` to
serve (it stays in the foreground until ``fusermount3 -u MOUNTPOINT``), or
``python -m bench.memtree --take DIR --snapshot FILE`` to take a snapshot.
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pyfuse3

from bench.memfs import TIMEOUT, TreePeer, serve_until_unmounted

log = logging.getLogger("bench.memtree")

SNAPSHOT_VERSION = 1
#: Inode of entry 0 of a snapshot (its top directory); entry ``i`` is ``FIRST_INODE + i``.
FIRST_INODE = pyfuse3.ROOT_INODE + 1


@dataclass
class Entry:
    """One entry of a snapshot: its place in the tree and what ``lstat`` said of it."""

    parent: int
    name: bytes
    mode: int
    size: int
    mtime_ns: int
    nlink: int
    target: bytes | None = None
    #: Positions in the snapshot of a directory's entries, in readdir order.
    children: list[int] = field(default_factory=list)


@dataclass
class Snapshot:
    """A tree as ``take`` saw it: entry 0 is the top directory (its parent is -1)."""

    source: str
    entries: list[Entry]

    def counts(self) -> dict[str, int]:
        """Directories, files and symlinks, the top directory included."""
        found: collections.Counter[str] = collections.Counter()
        for entry in self.entries:
            if stat.S_ISDIR(entry.mode):
                found["dirs"] += 1
            elif stat.S_ISLNK(entry.mode):
                found["symlinks"] += 1
            else:
                found["files"] += 1
        return dict(found)


def _entry(parent: int, name: bytes, st: os.stat_result, target: bytes | None) -> Entry:
    return Entry(parent, name, st.st_mode, st.st_size, st.st_mtime_ns, st.st_nlink, target)


def take(top: Path) -> Snapshot:
    """Walk ``top`` depth first and keep every entry's attributes (symlinks not followed)."""
    root = os.fsencode(top)
    entries = [_entry(-1, os.path.basename(root.rstrip(b"/")), os.lstat(root), None)]
    pending = [(0, root)]
    while pending:
        index, path = pending.pop()
        with os.scandir(path) as listing:
            found = list(listing)
        for item in found:
            st = item.stat(follow_symlinks=False)
            target = os.readlink(item.path) if stat.S_ISLNK(st.st_mode) else None
            entries.append(_entry(index, item.name, st, target))
            entries[index].children.append(len(entries) - 1)
            if stat.S_ISDIR(st.st_mode):
                pending.append((len(entries) - 1, item.path))
    return Snapshot(os.fsdecode(root), entries)


def save(snapshot: Snapshot, path: Path) -> None:
    """Write ``snapshot`` as JSON (names and symlink texts as surrogate-escaped strings)."""
    rows = [[e.parent, os.fsdecode(e.name), e.mode, e.size, e.mtime_ns, e.nlink,
             None if e.target is None else os.fsdecode(e.target)] for e in snapshot.entries]
    path.write_text(json.dumps({"version": SNAPSHOT_VERSION, "source": snapshot.source,
                                "entries": rows}, separators=(",", ":")))


def load(path: Path) -> Snapshot:
    """Read a snapshot ``save`` wrote; children in the order they were saved."""
    doc = json.loads(path.read_text())
    if doc.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"{path}: snapshot version {doc.get('version')}, "
                         f"not {SNAPSHOT_VERSION}")
    entries = []
    for parent, name, mode, size, mtime_ns, nlink, target in doc["entries"]:
        entries.append(Entry(parent, os.fsencode(name), mode, size, mtime_ns, nlink,
                             None if target is None else os.fsencode(target)))
        if parent >= 0:
            entries[parent].children.append(len(entries) - 1)
    return Snapshot(doc["source"], entries)


class MemTree(TreePeer):
    """Serves one snapshot under the mount's root, from memory."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.entries = snapshot.entries
        self.names: dict[int, dict[bytes, int]] = {
            i: {self.entries[c].name: c for c in e.children}
            for i, e in enumerate(self.entries) if stat.S_ISDIR(e.mode)}
        top = self.entries[0]
        self._root = Entry(-1, b"", top.mode, 0, top.mtime_ns, 3, None, [0])

    def _get(self, inode: int) -> Entry:
        if inode == pyfuse3.ROOT_INODE:
            return self._root
        index = inode - FIRST_INODE
        if not 0 <= index < len(self.entries):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.entries[index]

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = self._get(inode)
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = inode
        attrs.st_mode = entry.mode
        attrs.st_nlink = entry.nlink
        attrs.st_size = entry.size
        attrs.st_uid = self._uid
        attrs.st_gid = self._gid
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = entry.mtime_ns
        attrs.st_blksize = 4096
        attrs.st_blocks = (entry.size + 511) // 512
        attrs.attr_timeout = TIMEOUT
        attrs.entry_timeout = TIMEOUT
        return attrs

    def _children(self, inode: int) -> list[int]:
        entry = self._get(inode)
        if not stat.S_ISDIR(entry.mode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return entry.children

    # -- handlers -------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.requests["lookup"] += 1
        if parent_inode == pyfuse3.ROOT_INODE:
            found = 0 if name == self.entries[0].name else None
        else:
            self._children(parent_inode)
            found = self.names[parent_inode - FIRST_INODE].get(name)
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(found + FIRST_INODE)

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        self.requests["readlink"] += 1
        target = self._get(inode).target
        if target is None:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return target

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        self.requests["opendir"] += 1
        self._children(inode)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        self.requests["readdir"] += 1
        children = self._children(fh)
        for pos in range(start_id, len(children)):
            index = children[pos]
            if not pyfuse3.readdir_reply(token, self.entries[index].name,
                                         self._attrs(index + FIRST_INODE), pos + 1):
                break
            self.readdir_entries += 1


def serve(mountpoint: Path, snapshot_file: Path, stats_file: Path | None) -> None:
    """Mount the snapshot, serve until unmounted, then write the request counts."""
    snapshot = load(snapshot_file)
    ops = MemTree(snapshot)
    log.info("memtree: %d entries of %s at %s", len(snapshot.entries), snapshot.source,
             mountpoint)
    serve_until_unmounted(ops, mountpoint, {*pyfuse3.default_options, "fsname=h5bench-memtree",
                                            "ro", "default_permissions"}, stats_file)


def main(argv: list[str] | None = None) -> int:
    """Command line: serve a snapshot at MOUNTPOINT, or ``--take DIR`` one."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint", type=Path, nargs="?",
                        help="where to serve the snapshot (not with --take)")
    parser.add_argument("--snapshot", type=Path, required=True,
                        help="the snapshot file to serve, or to write with --take")
    parser.add_argument("--take", type=Path, default=None, metavar="DIR",
                        help="walk DIR and write its snapshot instead of serving")
    parser.add_argument("--stats", type=Path, default=None,
                        help="write request counts (JSON) here on unmount")
    parser.add_argument("--log-level", default="WARNING", type=str.upper)
    args = parser.parse_args(argv)
    if (args.mountpoint is None) == (args.take is None):
        parser.error("give a MOUNTPOINT to serve, or --take DIR")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    if args.take is not None:
        snapshot = take(args.take)
        save(snapshot, args.snapshot)
        log.info("%s: %d entries (%s)", args.take, len(snapshot.entries), snapshot.counts())
    else:
        serve(args.mountpoint, args.snapshot, args.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
