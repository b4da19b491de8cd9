"""``mountd.fuse_ops.Operations`` driven directly, without FUSE: the fast unit tier.

Each test builds what ``mountd.daemon._serve`` builds (a ``CachedCatalog``, the
real ``Tree`` with every registered view, ``Operations``, the ``.h5mount``
control directory over a ``stats.Reporter``) over an in-memory catalog
(``tests.modelcat``), and calls the request handlers as pyfuse3 would, inside
``trio.run``. Only the kernel boundary is stood in for: ``pyfuse3.readdir_reply``
is replaced by a recorder whose reply buffer holds a given number of entries
(it answers False after that, as the kernel does when its buffer is full), and
requests that need a caller whose uid is not 0 use a small object with the
fields of ``pyfuse3.RequestContext`` (the real one's fields cannot be set).

Covered: lookups of every kind of entry and their errors (ENOENT, ENOTDIR),
lookup counts and ``forget``; getattr modes and ``st_size`` equal to the bytes
read for every file of a tree walked through the handlers, attribute timeouts
of stand-in sizes and control files; readdir read in pieces, resumed by cookie
and restarted, over a group of thousands of links and a dataset of thousands
of chunks (the streaming listing and its window); xattrs and their
namespaces; EROFS for every modifying request; the mapping of failures to
errno, one broken object at a time, and the request and error counters; the
control directory; ACLs; drain. No server, subprocess or mount is used.
"""

from __future__ import annotations

import collections
import errno
import io
import json
import os
import posixpath
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np
import pyfuse3
import pytest
import trio
import trio.testing

from layouts.model import (
    AnyObject,
    Attribute,
    ChunkIndex,
    Domain,
    Link,
    LinkKind,
    ObjectKind,
)
from layouts.views import VIEWS
from mountd import stats
from mountd.acls import AclPolicy
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.metacache import CachedCatalog
from mountd.config import MountConfig
from mountd.control import CONTROL_DIR, REUSE
from mountd.errors import Corrupt, Forbidden, StorageError
from mountd.fuse_ops import Operations, Owner
from mountd.inodes import ROOT_INODE
from mountd.tree import make_tree
from mountd.tree.nodes import STREAM_WINDOW, DirNode
from mountd.tree.sidecar import XATTR_MAX
from tests.modelcat import MemoryCatalog, MemoryChunks, dataset, group, strings, table

TTL = 60.0
OWNER = Owner(uid=1234, gid=5678)
#: The real request context: every field is 0 (root), and cannot be set.
ROOT_CTX = pyfuse3.RequestContext()
FILE_MODE = stat.S_IFREG | 0o444
DIR_MODE = stat.S_IFDIR | 0o555
LINK_MODE = stat.S_IFLNK | 0o777


@dataclass(frozen=True)
class Caller:
    """A stand-in for ``pyfuse3.RequestContext`` with a chosen uid."""

    uid: int
    gid: int = 0
    pid: int = 4242
    umask: int = 0o022


# --------------------------------------------------------------------------- the kernel side


@dataclass(frozen=True)
class Reply:
    """One directory entry as ``readdir_reply`` was given it (copied at the call:
    ``Operations`` reuses one attributes object for entries that share a stat)."""

    name: str
    ino: int
    mode: int
    size: int
    attr_timeout: float
    next_id: int


class ReplyBuffer:
    """Stands in for ``pyfuse3.ReaddirToken``: room for ``room`` entries."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.accepted: list[Reply] = []
        self.refused: list[Reply] = []


def readdir_reply(token: ReplyBuffer, name: bytes, attr: pyfuse3.EntryAttributes,
                  next_id: int) -> bool:
    """The stand-in for ``pyfuse3.readdir_reply``: False once the buffer is full."""
    reply = Reply(name.decode("utf-8", "surrogateescape"), attr.st_ino, attr.st_mode,
                  attr.st_size, attr.attr_timeout, next_id)
    if len(token.accepted) >= token.room:
        token.refused.append(reply)
        return False
    token.accepted.append(reply)
    return True


@pytest.fixture(autouse=True)
def kernel_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyfuse3, "readdir_reply", readdir_reply)


# --------------------------------------------------------------------------- catalogs


class FaultyCatalog(MemoryCatalog):
    """A memory catalog in which fetching the objects named in ``faults`` raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults: dict[str, Exception] = {}
        self.fetches: collections.Counter[str] = collections.Counter()

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        self.fetches[obj_id] += 1
        fault = self.faults.get(obj_id)
        if fault is not None:
            raise fault
        return await super().get_object(domain, obj_id)


class FaultyChunks(MemoryChunks):
    """Chunks in memory; reading one of ``faults`` raises, one of ``slow`` waits
    ``delay`` seconds; counts listings and the listings still open."""

    def __init__(self, chunks: dict[ChunkIndex, bytes]) -> None:
        super().__init__(chunks)
        self.faults: dict[ChunkIndex, Exception] = {}
        self.slow: set[ChunkIndex] = set()
        self.delay = 1.0
        self.listings = 0
        self.open_listings = 0
        #: Listings fail with a StorageError after this many entries (None: never).
        self.fail_listing_after: int | None = None

    async def read(self, index: ChunkIndex) -> bytes | None:
        if index in self.slow:
            await trio.sleep(self.delay)
        fault = self.faults.get(index)
        if fault is not None:
            raise fault
        return await super().read(index)

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        self.listings += 1
        self.open_listings += 1
        try:
            for count, index in enumerate(list(self.chunks)):
                if count == self.fail_listing_after:
                    raise StorageError("chunks/?list", "listing page lost after retries")
                yield index
        finally:
            self.open_listings -= 1


def hard(obj_id: str) -> Link:
    kind = {"g": ObjectKind.GROUP, "d": ObjectKind.DATASET}[obj_id[0]]
    return Link(LinkKind.HARD, obj_id, target_kind=kind)


DATA = np.arange(6 * 5, dtype="<f4").reshape(6, 5)
STORED = [(0, 0), (1, 1), (0, 1)]
WORDS = ["alpha", "", "gamma delta", "é", "last one"]
ROWS = np.array([(1, 2.5), (2, -1.0), (3, 0.25)], dtype=[("id", "<i4"), ("x", "<f8")])
BIG_TEXT = "x" * (XATTR_MAX + 1)


def sample_catalog() -> FaultyCatalog:
    """A bucket ``home/u/f.h5`` (and ``home/u/g.h5``) with a group, datasets of
    fixed-size, variable-length and compound types, soft, dangling, external
    and cyclic links, and attributes."""
    dset = dataset("d-1", DATA, (4, 3), stored=STORED, fill=-1.0)
    object.__setattr__(dset, "attrs", (
        Attribute("units", "mm"),
        Attribute("scale", [1.5, 2.0]),
        Attribute("count", 3),
        Attribute("huge", BIG_TEXT),
    ))
    root = group("g-root", g1=hard("g-1"), table=hard("d-t"),
                 soft=Link(LinkKind.SOFT, "/g1/dset"),
                 dangling=Link(LinkKind.SOFT, "/nowhere/x"),
                 ext=Link(LinkKind.EXTERNAL, "/", domain="/home/u/g.h5"),
                 extout=Link(LinkKind.EXTERNAL, "/a", domain="../../../../etc/passwd"))
    object.__setattr__(root, "attrs", (Attribute("title", "demo"),))
    objects: dict[str, AnyObject] = {
        "g-root": root,
        "g-1": group("g-1", dset=hard("d-1"), words=hard("d-w"), up=hard("g-root"),
                     parent=Link(LinkKind.SOFT, "../../../..")),
        "d-1": dset,
        "d-w": strings("d-w", WORDS, 2),
        "d-t": table("d-t", ROWS, 2),
        "g-other": group("g-other"),
    }
    domains = {
        "home/u/f.h5": Domain("home/u/f.h5", "g-root", 1.5e9),
        "home/u/g.h5": Domain("home/u/g.h5", "g-other", 1.5e9),
    }
    folders = {"": ["home"], "home": ["u"], "home/u": ["f.h5", "g.h5"]}
    return FaultyCatalog(domains, objects, folders)


# --------------------------------------------------------------------------- the harness


class Mount:
    """The daemon's objects for one mount, and the test's own record of the
    requests it sent (``sent``) and the error replies it got (``got``)."""

    def __init__(self, catalog: MemoryCatalog, ttl: float = TTL,
                 acls: AclPolicy | None = None) -> None:
        self.config = MountConfig(source="memory://sample", mountpoint="/mnt/sample",
                                  uid=OWNER.uid, gid=OWNER.gid, metadata_ttl=ttl)
        self.source = catalog
        self.chunk_cache = ChunkCache(self.config.chunk_cache)
        #: The clock of the metadata cache and of the control files (monotonic
        #: seconds), moved by the test alone.
        self.now = 0.0
        self.catalog = CachedCatalog(catalog, ttl=ttl, clock=lambda: self.now)
        self.tree = make_tree(self.catalog, views=VIEWS, ttl=ttl, chunk_cache=self.chunk_cache)
        self.acls = acls
        self.sent: collections.Counter[str] = collections.Counter()
        self.got: collections.Counter[str] = collections.Counter()
        self._ops: Operations | None = None

    async def start(self) -> Mount:
        """Build ``Operations`` and the control directory as ``daemon._serve`` does."""
        def control(ops: Operations) -> DirNode:
            reporter = stats.Reporter(self.config, ops, self.tree, self.catalog, None)
            return reporter.control_dir(clock=lambda: self.now)

        self._ops = Operations(await self.tree.root(), OWNER, ttl=self.config.metadata_ttl,
                               acls=self.acls, control=control)
        return self

    @property
    def ops(self) -> Operations:
        assert self._ops is not None
        return self._ops

    # -- one request ---------------------------------------------------------------

    async def call(self, name: str, *args: Any) -> Any:
        self.sent[name] += 1
        try:
            return await getattr(self.ops, name)(*args)
        except pyfuse3.FUSEError as exc:
            self.got[errno.errorcode[exc.errno]] += 1
            raise

    async def fails(self, name: str, *args: Any) -> int:
        """The errno of a request that must fail."""
        with pytest.raises(pyfuse3.FUSEError) as info:
            await self.call(name, *args)
        return info.value.errno

    # -- what the kernel does for a system call -----------------------------------

    async def lookup(self, parent: int, name: str,
                     ctx: Any = ROOT_CTX) -> pyfuse3.EntryAttributes:
        return await self.call("lookup", parent, name.encode("utf-8", "surrogateescape"), ctx)

    async def walk(self, path: str) -> pyfuse3.EntryAttributes:
        """Look up each component of ``path`` from the root (as path resolution does)."""
        entry = await self.call("getattr", ROOT_INODE, ROOT_CTX)
        for part in filter(None, path.split("/")):
            entry = await self.lookup(entry.st_ino, part)
        return entry

    async def ino(self, path: str) -> int:
        return int((await self.walk(path)).st_ino)

    async def readdir_all(self, fh: int, room: int, start: int = 0) -> list[Reply]:
        """Read a listing from cookie ``start`` to its end, ``room`` entries per
        request, each request resuming from the last cookie accepted."""
        got: list[Reply] = []
        cookie = start
        while True:
            buffer = ReplyBuffer(room)
            await self.call("readdir", fh, cookie, buffer)
            if not buffer.accepted:
                return got
            got.extend(buffer.accepted)
            cookie = buffer.accepted[-1].next_id

    async def listdir(self, ino: int, room: int = 1 << 20) -> list[Reply]:
        fh = await self.call("opendir", ino, ROOT_CTX)
        try:
            return await self.readdir_all(fh, room)
        finally:
            await self.call("releasedir", fh)

    async def names(self, path: str) -> list[str]:
        return [reply.name for reply in await self.listdir(await self.ino(path))]

    async def read_all(self, ino: int, piece: int = 1 << 16) -> bytes:
        info = await self.call("open", ino, os.O_RDONLY, ROOT_CTX)
        try:
            data = bytearray()
            while True:
                got = bytes(await self.call("read", info.fh, len(data), piece))
                data += got
                if len(got) < piece:
                    return bytes(data)
        finally:
            await self.call("release", info.fh)

    async def read_path(self, path: str) -> bytes:
        return await self.read_all(await self.ino(path))

    async def readlink(self, ino: int) -> str:
        text: bytes = await self.call("readlink", ino, ROOT_CTX)
        return text.decode("utf-8", "surrogateescape")


def run(test: Callable[[], Awaitable[None]], clock: trio.abc.Clock | None = None) -> None:
    trio.run(test, clock=clock)


async def mount(catalog: MemoryCatalog | None = None, **kwargs: Any) -> Mount:
    return await Mount(catalog if catalog is not None else sample_catalog(), **kwargs).start()


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def expected_dset() -> np.ndarray:
    """d-1 as a reader sees it: the stored chunks hold DATA, the rest the fill value."""
    full = np.full(DATA.shape, -1.0, dtype="<f4")
    for i, j in STORED:
        region = (slice(i * 4, (i + 1) * 4), slice(j * 3, (j + 1) * 3))
        full[region] = DATA[region]
    return full


def is_mode(entry: Any, mode: int) -> bool:
    return int(entry.st_mode) == mode


# --------------------------------------------------------------------------- lookups


def test_lookup_finds_every_kind_of_entry() -> None:
    async def main() -> None:
        m = await mount()
        f5 = "home/u/f.h5"
        for path in ("home", "home/u", f5, f"{f5}/g1", f"{f5}/g1/dset", f"{f5}/g1/words"):
            assert is_mode(await m.walk(path), DIR_MODE), path
        for path in (f"{f5}.json", f"{f5}/g1.json", f"{f5}/g1/dset.json", f"{f5}/g1/dset.npy",
                     f"{f5}/g1/dset/.zarray", f"{f5}/g1/dset/.zattrs", f"{f5}/.zgroup",
                     f"{f5}/g1/dset/0.0", f"{f5}/g1/dset/1.1", f"{f5}/g1/words/2",
                     f"{f5}/table.csv"):
            assert is_mode(await m.walk(path), FILE_MODE), path
        for path, text in [(f"{f5}/soft", "g1/dset"), (f"{f5}/soft.json", "g1/dset.json"),
                           (f"{f5}/soft.npy", "g1/dset.npy"), (f"{f5}/g1/up", ".."),
                           (f"{f5}/ext", "../g.h5")]:
            entry = await m.walk(path)
            assert is_mode(entry, LINK_MODE), path
            assert await m.readlink(entry.st_ino) == text, path
            assert entry.st_size == len(text.encode()), path
        # times: a domain's root from the domain, symlinks from their group
        for path in (f5, f"{f5}/soft", f"{f5}/.zgroup"):
            entry = await m.walk(path)
            domain = m.source.domains[f5]
            assert entry.st_mtime_ns == int(domain.modified * 1e9), path
            assert entry.st_ctime_ns == entry.st_mtime_ns, path
        # a chunk file's bytes are the stored chunk's
        store = m.source.objects["d-1"].store  # type: ignore[union-attr]
        assert await m.read_path(f"{f5}/g1/dset/1.1") == store.chunks[(1, 1)]
        assert json.loads(await m.read_path(f"{f5}/g1/dset/.zarray"))["shape"] == [6, 5]
        assert np.load(io.BytesIO(await m.read_path(f"{f5}/g1/dset.npy"))).tolist() == \
            expected_dset().tolist()
    run(main)


def test_lookup_errors() -> None:
    async def main() -> None:
        m = await mount()
        f5 = await m.ino("home/u/f.h5")
        dset = await m.ino("home/u/f.h5/g1/dset")
        chunk = await m.ino("home/u/f.h5/g1/dset/0.0")
        sidecar = await m.ino("home/u/f.h5.json")
        link = await m.ino("home/u/f.h5/soft")
        home = await m.ino("home")
        missing = [(f5, "nope"), (f5, "nope.json"), (f5, "g1.npy"),
                   (dset, "1.0"),  # in range, not stored
                   (dset, "9.9"),  # out of range
                   (dset, "01.1"), (dset, "0"), (dset, ".zgroup"),
                   (home, "v"), (home, "u.json"), (ROOT_INODE, "nope"),
                   (f5, "dangling.json")]  # a dangling link has no sidecar
        for parent, name in missing:
            assert await m.fails("lookup", parent, name.encode(), ROOT_CTX) == errno.ENOENT, name
        files = (chunk, sidecar, link)
        for parent in files:
            assert await m.fails("lookup", parent, b"x", ROOT_CTX) == errno.ENOTDIR
            assert await m.fails("opendir", parent, ROOT_CTX) == errno.ENOTDIR
        assert await m.fails("open", dset, os.O_RDONLY, ROOT_CTX) == errno.EISDIR
        assert await m.fails("readlink", chunk, ROOT_CTX) == errno.EINVAL
        # an inode the kernel never got (or has forgotten)
        assert await m.fails("getattr", 10_000, ROOT_CTX) == errno.ENOENT
        assert m.ops.errors == m.got
        assert m.got == {"ENOENT": len(missing) + 1, "ENOTDIR": 2 * len(files), "EISDIR": 1,
                         "EINVAL": 1}
    run(main)


def test_lookup_counts_and_forget() -> None:
    async def main() -> None:
        m = await mount()
        table = m.ops.inodes
        g1 = await m.ino("home/u/f.h5/g1")
        first = await m.lookup(g1, "dset")
        # the same entry reached again, through parent nodes made anew: the same inode
        again = await m.walk("home/u/f.h5/g1/dset")
        assert again.st_ino == first.st_ino
        # and as readdir shows it (which counts as a lookup too: readdirplus)
        listed = {r.name: r.ino for r in await m.listdir(g1)}
        assert listed["dset"] == first.st_ino
        ino = first.st_ino
        await m.call("forget", [(ino, 2)])
        assert table.node(ino) is not None  # one lookup is still counted
        assert (await m.call("getattr", ino, ROOT_CTX)).st_ino == ino
        await m.call("forget", [(ino, 1)])
        assert table.node(ino) is None
        assert await m.fails("getattr", ino, ROOT_CTX) == errno.ENOENT
        # a later lookup gets a new number, which FUSE allows
        renewed = await m.lookup(g1, "dset")
        assert renewed.st_ino != ino and table.node(renewed.st_ino) is not None
        # the root is never forgotten
        await m.call("forget", [(ROOT_INODE, 100)])
        assert table.node(ROOT_INODE) is not None
        # forgetting many at once, and an inode already gone, is fine
        size = len(table)
        await m.call("forget", [(renewed.st_ino, 1), (ino, 1)])
        assert len(table) == size - 1
        statfs = await m.call("statfs", ROOT_CTX)
        assert statfs.f_files == len(table)
    run(main)


def test_readdir_entries_the_buffer_refused_are_not_counted() -> None:
    async def main() -> None:
        m = await mount()
        g1 = await m.ino("home/u/f.h5/g1")
        fh = await m.call("opendir", g1, ROOT_CTX)
        buffer = ReplyBuffer(2)
        await m.call("readdir", fh, 0, buffer)
        assert len(buffer.accepted) == 2 and len(buffer.refused) == 1
        refused = buffer.refused[0]
        # handed out for the reply, never given to the kernel: released at once
        assert m.ops.inodes.node(refused.ino) is None
        for reply in buffer.accepted:
            assert m.ops.inodes.node(reply.ino) is not None
            await m.call("forget", [(reply.ino, 1)])  # the kernel's one lookup
            assert m.ops.inodes.node(reply.ino) is None
        await m.call("releasedir", fh)
    run(main)


# --------------------------------------------------------------------------- getattr and sizes


async def walk_tree(m: Mount, top: str = "") -> dict[str, tuple[Reply, Any]]:
    """Every entry under ``top`` through the handlers: opendir, readdir, lookup,
    by path; each with its listing reply and its lookup's attributes."""
    found: dict[str, tuple[Reply, Any]] = {}
    todo = [top]
    while todo:
        path = todo.pop()
        ino = await m.ino(path)
        for reply in await m.listdir(ino, room=5):
            child = posixpath.join(path, reply.name)
            entry = await m.lookup(ino, reply.name)
            found[child] = (reply, entry)
            if stat.S_ISDIR(entry.st_mode):
                todo.append(child)
    return found


def lexical_target(link_path: str, text: str) -> list[str] | None:
    """Where symlink ``text`` at ``link_path`` leads, resolved by names alone
    from the mount root; None if it climbs above the root."""
    parts = link_path.split("/")[:-1]
    for comp in text.split("/"):
        if comp == "..":
            if not parts:
                return None
            parts.pop()
        elif comp not in ("", "."):
            parts.append(comp)
    return parts


def test_every_file_size_is_the_bytes_read() -> None:
    async def main() -> None:
        m = await mount()
        found = await walk_tree(m)
        kinds: collections.Counter[str] = collections.Counter()
        for path, (reply, entry) in sorted(found.items()):
            assert reply.ino == entry.st_ino, path  # listed and looked up: one inode
            assert reply.mode == entry.st_mode, path
            assert entry.st_uid == OWNER.uid and entry.st_gid == OWNER.gid
            attrs = await m.call("getattr", entry.st_ino, ROOT_CTX)
            if stat.S_ISREG(entry.st_mode):
                kinds["file"] += 1
                assert is_mode(entry, FILE_MODE), path
                data = await m.read_all(entry.st_ino, piece=7)  # odd pieces, many reads
                assert attrs.st_size == entry.st_size == len(data), path
                assert attrs.attr_timeout == TTL, path  # exact now
                if reply.attr_timeout:  # a listing's size is exact, or kept for no time
                    assert reply.size == len(data), path
                    assert reply.attr_timeout == TTL
            elif stat.S_ISDIR(entry.st_mode):
                kinds["dir"] += 1
                assert is_mode(entry, DIR_MODE), path
            else:
                kinds["symlink"] += 1
                assert is_mode(entry, LINK_MODE), path
                text = await m.readlink(entry.st_ino)
                assert entry.st_size == len(text.encode()), path
                # no symlink leads out of the mount, nor out of its domain
                target = lexical_target(path, text)
                assert target is not None, (path, text)
                assert target[:2] == ["home", "u"], (path, text)
        assert set(found) >= {
            "home/u/f.h5.json", "home/u/f.h5/g1/dset.npy", "home/u/f.h5/g1/words/2",
            "home/u/f.h5/table.csv", "home/u/f.h5/g1/dset/.zarray", "home/u/f.h5/.zgroup",
            "home/u/g.h5/.zattrs", "home/u/f.h5/extout", "home/u/f.h5/g1/parent"}
        assert CONTROL_DIR not in {path.split("/")[0] for path in found}
        assert kinds["file"] > 25 and kinds["dir"] == 8 and kinds["symlink"] > 8
    run(main)


def test_stand_in_sizes_are_not_kept_by_the_kernel() -> None:
    async def main() -> None:
        m = await mount()
        words = await m.ino("home/u/f.h5/g1/words")
        listed = {r.name: r for r in await m.listdir(words)}
        store = m.source.objects["d-w"].store  # type: ignore[union-attr]
        for index, data in store.chunks.items():
            reply = listed[".".join(map(str, index))]
            # variable-length chunks: the listing does not decode them to size them
            assert reply.attr_timeout == 0, reply
            entry = await m.lookup(words, reply.name)
            assert entry.st_size == len(data) and entry.attr_timeout == TTL
            assert await m.read_all(entry.st_ino) == data
        f5 = await m.ino("home/u/f.h5")
        csv = next(r for r in await m.listdir(f5) if r.name == "table.csv")
        assert csv.attr_timeout == 0  # the CSV is streamed once to learn its size
        entry = await m.lookup(f5, "table.csv")
        text = await m.read_all(entry.st_ino)
        assert entry.st_size == len(text) and entry.attr_timeout == TTL
        assert text.decode().splitlines() == ["id,x", "1,2.5", "2,-1.0", "3,0.25"]
        # sized once, the next listing gives the kept size
        csv = next(r for r in await m.listdir(f5) if r.name == "table.csv")
        assert csv.size == len(text)
    run(main)


def test_a_variable_length_chunk_is_sized_again_in_a_new_data_epoch() -> None:
    """A variable-length chunk's size is kept with the dataset's data epoch:
    rewritten in storage (its dataset's description unchanged), the chunk
    shows its new size once a new period begins, not the one kept."""
    async def main() -> None:
        m = await mount()
        words = await m.ino("home/u/f.h5/g1/words")
        first = await m.lookup(words, "0")
        store = m.source.objects["d-w"].store  # type: ignore[union-attr]
        assert first.st_size == len(store.chunks[(0,)])
        longer = np.array(["a much longer first word", "and a second"], dtype=object)
        store.chunks[(0,)] = bytes(numcodecs.VLenUTF8().encode(longer))
        assert (await m.lookup(words, "0")).st_size == first.st_size  # same period: kept
        m.tree.refresh()
        entry = await m.lookup(words, "0")
        assert entry.st_size == len(store.chunks[(0,)]) != first.st_size
        assert await m.read_all(entry.st_ino) == store.chunks[(0,)]
    run(main)


# --------------------------------------------------------------------------- readdir


def big_catalog(links: int, chunks: int) -> FaultyCatalog:
    """A domain whose root group has ``links`` links to empty groups, and a
    dataset ``big`` of ``chunks`` one-element chunks, stored in reverse order."""
    objects: dict[str, AnyObject] = {f"g-{i}": group(f"g-{i}") for i in range(links)}
    big = dataset("d-big", np.arange(chunks, dtype="<f4"), (1,))
    store = FaultyChunks(dict(reversed(big.store.chunks.items())))  # type: ignore[attr-defined]
    object.__setattr__(big, "store", store)
    objects["d-big"] = big
    objects["g-root"] = group("g-root", big=hard("d-big"),
                              **{f"n{i:05d}": hard(f"g-{i}") for i in range(links)})
    domains = {"f.h5": Domain("f.h5", "g-root", 2.0)}
    return FaultyCatalog(domains, objects, {}, single_domain="f.h5")


def test_readdir_in_pieces_resumes_and_restarts() -> None:
    async def main() -> None:
        m = await mount()
        g1 = await m.ino("home/u/f.h5/g1")
        whole = await m.listdir(g1)
        links = m.source.objects["g-1"].links  # type: ignore[union-attr]
        expected = {".zattrs", ".zgroup", *links, *(f"{n}.json" for n in links), "dset.npy"}
        assert [r.name for r in whole] == [".zattrs", ".zgroup", *sorted(expected - {
            ".zattrs", ".zgroup"})]
        for room in (1, 2, 3, 5):
            fh = await m.call("opendir", g1, ROOT_CTX)
            pieces = await m.readdir_all(fh, room)
            assert pieces == whole, room
            # from 0 again on the same handle (rewinddir), and from a cookie in the middle
            assert await m.readdir_all(fh, room) == whole
            middle = pieces[3].next_id
            assert await m.readdir_all(fh, room, start=middle) == whole[4:]
            await m.call("releasedir", fh)
        assert m.ops.open_dirs == 0
    run(main)


def test_big_group_and_streamed_dataset_in_small_pieces() -> None:
    links, chunks = 2500, 3000

    async def main() -> None:
        m = await mount(big_catalog(links, chunks))
        # the group: every link, its sidecar, read 37 entries at a time
        group_entries = await m.listdir(ROOT_INODE, room=37)
        names = [r.name for r in group_entries]
        expected = sorted([*(f"n{i:05d}" for i in range(links)),
                           *(f"n{i:05d}.json" for i in range(links)),
                           "big", "big.json", "big.npy"])
        assert names == [".root.json", ".zattrs", ".zgroup", *expected]
        assert len({r.ino for r in group_entries}) == len(group_entries)
        # the dataset: a streamed listing, never held whole
        big = await m.lookup(ROOT_INODE, "big")
        store: FaultyChunks = m.source.objects["d-big"].store  # type: ignore[union-attr,assignment]
        order = [f"{i}" for (i,) in store.chunks]  # storage order
        fh = await m.call("opendir", big.st_ino, ROOT_CTX)
        pieces = await m.readdir_all(fh, room=29)
        assert [r.name for r in pieces] == [".zarray", ".zattrs", *order]
        assert store.listings == 1
        assert all(r.size == 4 and r.attr_timeout == TTL for r in pieces[2:])
        # the kernel asks again from a recent cookie: served from the window
        recent = pieces[-10]
        assert await m.readdir_all(fh, 29, start=recent.next_id) == pieces[-9:]
        # from a cookie older than the window: the stream starts again and skips to it
        old = pieces[len(pieces) - STREAM_WINDOW - 100]
        tail = await m.readdir_all(fh, 64, start=old.next_id)
        assert tail == pieces[len(pieces) - STREAM_WINDOW - 99:]
        # and from 0, which gives the same
        assert await m.readdir_all(fh, 1000) == pieces
        # listed whole once, the chunk names are kept with the dataset object: the
        # restarts needed no storage listing
        assert store.listings == 1
        await m.call("releasedir", fh)
        # left half way, released: the storage listing is closed
        fh = await m.call("opendir", big.st_ino, ROOT_CTX)
        await m.call("readdir", fh, 0, ReplyBuffer(10))
        await m.call("releasedir", fh)
        assert store.open_listings == 0
        assert m.ops.open_dirs == 0
    run(main)


def test_readdir_failing_part_way_keeps_no_inodes() -> None:
    """A streamed listing that fails after more than one batch (64 entries) went
    into a reply: pyfuse3 then sends the error alone, so the lookups counted for
    those entries must be taken back, or the inodes would never be forgotten."""
    async def main() -> None:
        catalog = big_catalog(0, 200)
        store: FaultyChunks = catalog.objects["d-big"].store  # type: ignore[union-attr,assignment]
        m = await mount(catalog)
        big = await m.lookup(ROOT_INODE, "big")
        store.fail_listing_after = 150
        held = len(m.ops.inodes)
        fh = await m.call("opendir", big.st_ino, ROOT_CTX)
        buffer = ReplyBuffer(1000)
        assert await m.fails("readdir", fh, 0, buffer) == errno.EIO
        assert buffer.accepted  # added to the reply before the listing failed
        await m.call("releasedir", fh)
        assert len(m.ops.inodes) == held
    run(main)


# --------------------------------------------------------------------------- xattrs


def test_xattrs_are_the_model_attributes() -> None:
    async def main() -> None:
        m = await mount()
        dset = await m.ino("home/u/f.h5/g1/dset")
        model = m.source.objects["d-1"]
        names = set(await m.call("listxattr", dset, ROOT_CTX))
        shown = {a.name for a in model.attrs if len(json.dumps(a.value)) <= XATTR_MAX}
        assert names == {b"user.h5.id", b"user.h5.kind", b"user.h5.dtype", b"user.h5.shape",
                         *(f"user.h5.attr.{n}".encode() for n in shown)}
        for attr in model.attrs:
            name = f"user.h5.attr.{attr.name}".encode()
            if attr.name not in shown:  # over 64 KiB: only in the sidecar
                assert await m.fails("getxattr", dset, name, ROOT_CTX) == pyfuse3.ENOATTR
                continue
            value = await m.call("getxattr", dset, name, ROOT_CTX)
            if isinstance(attr.value, str):
                assert value == attr.value.encode()
            else:
                assert json.loads(value) == attr.value
        assert await m.call("getxattr", dset, b"user.h5.id", ROOT_CTX) == model.id.encode()
        assert await m.call("getxattr", dset, b"user.h5.kind", ROOT_CTX) == b"dataset"
        shape = await m.call("getxattr", dset, b"user.h5.shape", ROOT_CTX)
        assert json.loads(shape) == list(DATA.shape)
        sidecar = json.loads(await m.read_path("home/u/f.h5/g1/dset.json"))
        assert sidecar["attributes"]["huge"] == BIG_TEXT
        f5 = await m.ino("home/u/f.h5")
        assert await m.call("getxattr", f5, b"user.h5.attr.title", ROOT_CTX) == b"demo"
        assert await m.call("getxattr", f5, b"user.h5.kind", ROOT_CTX) == b"group"
        chunk = await m.ino("home/u/f.h5/g1/dset/0.0")
        link = await m.ino("home/u/f.h5/soft")
        inodes = (dset, f5, chunk, link, ROOT_INODE)
        other = (b"security.selinux", b"system.posix_acl_access", b"system.posix_acl_default",
                 b"trusted.x", b"h5.id", b"")
        for ino in inodes:
            for name in other:
                assert await m.fails("getxattr", ino, name, ROOT_CTX) == errno.ENOTSUP, name
            assert await m.fails("getxattr", ino, b"user.nope", ROOT_CTX) == pyfuse3.ENOATTR
        assert await m.call("listxattr", chunk, ROOT_CTX) == []
        assert m.ops.errors == m.got
        missing = len(model.attrs) - len(shown) + len(inodes)
        assert m.got == {"ENOTSUP": len(inodes) * len(other),
                         errno.errorcode[pyfuse3.ENOATTR]: missing}
    run(main)


# --------------------------------------------------------------------------- read-only


MODIFYING: list[tuple[str, tuple[Any, ...]]] = [
    ("setattr", (ROOT_INODE, pyfuse3.EntryAttributes(), pyfuse3.SetattrFields(), None,
                 ROOT_CTX)),
    ("setxattr", (ROOT_INODE, b"user.x", b"1", ROOT_CTX)),
    ("removexattr", (ROOT_INODE, b"user.x", ROOT_CTX)),
    ("write", (1, 0, b"data")),
    ("create", (ROOT_INODE, b"new", 0o644, os.O_WRONLY, ROOT_CTX)),
    ("mknod", (ROOT_INODE, b"new", stat.S_IFIFO | 0o644, 0, ROOT_CTX)),
    ("mkdir", (ROOT_INODE, b"new", 0o755, ROOT_CTX)),
    ("unlink", (ROOT_INODE, b"home", ROOT_CTX)),
    ("rmdir", (ROOT_INODE, b"home", ROOT_CTX)),
    ("symlink", (ROOT_INODE, b"new", b"home", ROOT_CTX)),
    ("rename", (ROOT_INODE, b"home", ROOT_INODE, b"other", 0, ROOT_CTX)),
    ("link", (2, ROOT_INODE, b"new", ROOT_CTX)),
]


def test_everything_that_would_modify_is_erofs() -> None:
    async def main() -> None:
        m = await mount()
        sidecar = await m.ino("home/u/f.h5.json")
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC,
                      os.O_RDONLY | os.O_APPEND, os.O_WRONLY | os.O_CREAT):
            assert await m.fails("open", sidecar, flags, ROOT_CTX) == errno.EROFS, flags
        for name, args in MODIFYING:
            assert await m.fails(name, *args) == errno.EROFS, name
        assert m.ops.open_files == 0
        # still readable
        assert json.loads(await m.read_all(sidecar))["kind"] == "group"
    run(main)


def test_erofs_replies_are_counted() -> None:
    """Every request and error reply is counted, the refused writes too (a 'ro'
    kernel mount answers most of them itself, but not the counters' promise)."""
    async def main() -> None:
        m = await mount()
        for name, args in MODIFYING:
            await m.fails(name, *args)
        assert m.ops.errors == m.got
        assert m.ops.requests == m.sent
    run(main)


# --------------------------------------------------------------------------- errors


def test_broken_objects_fail_alone_with_their_errno(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        catalog = sample_catalog()
        root = catalog.objects["g-root"]
        catalog.objects["g-root"] = group(
            "g-root", **root.links,  # type: ignore[union-attr]
            bad=hard("d-bad"), gone=hard("d-gone"), lost=hard("d-lost"),
            secret=hard("g-secret"), deep=hard("g-deep"))
        catalog.objects["g-deep"] = group("g-deep", oops=hard("g-oops"), fine=hard("g-1"))
        for obj_id in ("d-bad", "d-gone", "g-secret", "g-oops"):
            catalog.objects[obj_id] = group(obj_id)
        run_id = os.urandom(4).hex()  # errors are logged once per key, per process
        catalog.faults = {
            "d-bad": Corrupt(f"db/{run_id}/d-bad.json", "not JSON"),
            "d-gone": StorageError(f"db/{run_id}/d-gone.json", "connection reset"),
            "g-secret": Forbidden("file:///etc/secret is outside the mount"),
            "g-oops": RuntimeError(f"a bug {run_id}"),
        }
        m = await mount(catalog)
        f5 = await m.ino("home/u/f.h5")
        # the group still lists, the broken children with it
        names = {r.name for r in await m.listdir(f5)}
        assert {"bad", "gone", "lost", "secret", "deep", "g1", "table.csv"} <= names
        deep = await m.lookup(f5, "deep")
        broken = [(f5, "bad", errno.EIO, Corrupt), (f5, "bad.json", errno.EIO, Corrupt),
                  (f5, "gone", errno.EIO, StorageError),
                  (f5, "gone.json", errno.EIO, StorageError),
                  # linked, but not stored: broken metadata, not a missing name
                  (f5, "lost", errno.EIO, StorageError),
                  (f5, "secret", errno.EACCES, Forbidden),
                  (deep.st_ino, "oops", errno.EIO, RuntimeError),
                  (deep.st_ino, "oops.json", errno.EIO, RuntimeError)]
        for parent, name, code, _ in broken:
            assert await m.fails("lookup", parent, name.encode(), ROOT_CTX) == code, name
        # the siblings work
        fine = await m.lookup(deep.st_ino, "fine")
        assert stat.S_ISDIR(fine.st_mode)
        assert json.loads(await m.read_path("home/u/f.h5/g1/dset.json"))["shape"] == [6, 5]
        # a failure is read once per metadata_ttl, not once per request
        assert catalog.fetches["d-bad"] == 1
        assert m.ops.errors == m.got == collections.Counter(
            errno.errorcode[code] for _, _, code, _ in broken)
        assert m.ops.failures == collections.Counter(cls.__name__ for _, _, _, cls in broken)
        assert "unexpected error in lookup" in caplog.text
        assert caplog.text.count(f"cannot read db/{run_id}/d-bad.json") == 1  # logged once
    run(main)


def test_one_broken_chunk_fails_its_reads_only() -> None:
    async def main() -> None:
        catalog = sample_catalog()
        dset = catalog.objects["d-1"]
        store = FaultyChunks(dict(dset.store.chunks))  # type: ignore[union-attr]
        store.faults[(0, 1)] = Corrupt("chunks/d-1/0_1", "bad zlib stream")
        store.faults[(1, 1)] = ValueError("a decoder bug")
        object.__setattr__(dset, "store", store)
        m = await mount(catalog)
        ino = await m.ino("home/u/f.h5/g1/dset")
        entries = {r.name: r for r in await m.listdir(ino)}
        assert {"0.0", "0.1", "1.1"} <= set(entries)
        for name in ("0.1", "1.1"):
            chunk = await m.lookup(ino, name)
            assert chunk.st_size == DATA.itemsize * 12  # sizes need no decoding
            info = await m.call("open", chunk.st_ino, os.O_RDONLY, ROOT_CTX)
            assert await m.fails("read", info.fh, 0, 4096) == errno.EIO
            await m.call("release", info.fh)
        assert await m.read_path("home/u/f.h5/g1/dset/0.0") == store.chunks[(0, 0)]
        del store.faults[(1, 1)]  # the array file then needs only 0.1 of the broken ones
        npy = await m.ino("home/u/f.h5/g1/dset.npy")
        info = await m.call("open", npy, os.O_RDONLY, ROOT_CTX)
        assert await m.fails("read", info.fh, 0, 1 << 16) == errno.EIO  # needs 0.1
        await m.call("release", info.fh)
        assert m.ops.errors == m.got == {"EIO": 3}
        assert m.ops.failures["Corrupt"] == 2 and m.ops.failures["ValueError"] == 1
    run(main)


def test_request_counters() -> None:
    async def main() -> None:
        m = await mount()
        await walk_tree(m, "home/u/f.h5/g1")
        await m.fails("lookup", ROOT_INODE, b"nope", ROOT_CTX)
        await m.call("getxattr", await m.ino("home/u/f.h5"), b"user.h5.id", ROOT_CTX)
        await m.fails("getxattr", ROOT_INODE, b"security.selinux", ROOT_CTX)
        await m.read_path("home/u/f.h5.json")
        assert m.ops.requests == m.sent
        assert m.ops.errors == m.got
        assert m.ops.open_files == 0 and m.ops.open_dirs == 0 and m.ops.in_flight == 0
        latency = m.ops.latency
        assert latency["read"].figures()["count"] == m.sent["read"]
        assert latency["metadata"].figures()["count"] == sum(
            n for name, n in m.sent.items()
            if name not in ("read", "forget", "statfs", "release", "releasedir"))
    run(main)


# --------------------------------------------------------------------------- consistency


def test_changes_show_after_metadata_ttl_and_after_refresh() -> None:
    async def main() -> None:
        m = await mount()
        g1 = await m.ino("home/u/f.h5/g1")
        before = await m.read_path("home/u/f.h5/g1.json")
        links = dict(m.source.objects["g-1"].links)  # type: ignore[union-attr]
        links["added"] = hard("d-t")
        changed = group("g-1", **links)
        object.__setattr__(changed, "attrs", (Attribute("note", "changed"),))
        m.source.objects["g-1"] = changed
        # within metadata_ttl: the group as it was read
        assert await m.fails("lookup", g1, b"added", ROOT_CTX) == errno.ENOENT
        assert await m.read_path("home/u/f.h5/g1.json") == before
        m.now += TTL + 1
        assert stat.S_ISDIR((await m.lookup(g1, "added")).st_mode)
        sidecar = await m.walk("home/u/f.h5/g1.json")
        after = await m.read_all(sidecar.st_ino)
        assert sidecar.st_size == len(after) != len(before)
        assert json.loads(after)["attributes"] == {"note": "changed"}
        assert await m.call("getxattr", g1, b"user.h5.attr.note", ROOT_CTX) == b"changed"
        # SIGHUP: what is cached is dropped at once (daemon: catalog.drop, tree.refresh)
        del links["added"]
        m.source.objects["g-1"] = group("g-1", **links)
        m.catalog.drop()
        m.tree.refresh()
        assert await m.fails("lookup", g1, b"added", ROOT_CTX) == errno.ENOENT
        assert await m.read_path("home/u/f.h5/g1.json") == before
    run(main)


def test_page_cache_kept_only_within_one_period() -> None:
    async def main() -> None:
        m = await mount()
        chunk = await m.ino("home/u/f.h5/g1/dset/0.0")
        control = await m.ino(f"{CONTROL_DIR}/stats.json")
        opened: list[tuple[bool, bool]] = []
        for _ in range(2):
            info = await m.call("open", chunk, os.O_RDONLY, ROOT_CTX)
            opened.append((info.keep_cache, info.direct_io))
            await m.call("release", info.fh)
        m.tree.refresh()  # a new period (SIGHUP, or metadata_ttl over)
        info = await m.call("open", chunk, os.O_RDONLY, ROOT_CTX)
        opened.append((info.keep_cache, info.direct_io))
        await m.call("release", info.fh)
        assert opened == [(False, False), (True, False), (False, False)]
        info = await m.call("open", control, os.O_RDONLY, ROOT_CTX)
        assert info.direct_io and not info.keep_cache  # made when read: never cached
        await m.call("release", info.fh)
    run(main)


# --------------------------------------------------------------------------- the control directory


def test_control_directory() -> None:
    async def main() -> None:
        m = await mount()
        assert CONTROL_DIR not in {r.name for r in await m.listdir(ROOT_INODE)}
        control = await m.lookup(ROOT_INODE, CONTROL_DIR)
        assert is_mode(control, DIR_MODE)
        assert (await m.lookup(ROOT_INODE, CONTROL_DIR)).st_ino == control.st_ino
        # at the root only
        home = await m.ino("home")
        assert await m.fails("lookup", home, CONTROL_DIR.encode(), ROOT_CTX) == errno.ENOENT
        listing = await m.listdir(control.st_ino)
        assert sorted(r.name for r in listing) == ["config.json", "metrics", "stats.json"]
        for reply in listing:
            entry = await m.lookup(control.st_ino, reply.name)
            assert is_mode(entry, FILE_MODE)
            assert reply.attr_timeout == entry.attr_timeout == 0  # made when read
            attrs = await m.call("getattr", entry.st_ino, ROOT_CTX)
            assert attrs.attr_timeout == 0
            data = await m.read_all(entry.st_ino, piece=100)
            assert len(data) == attrs.st_size == entry.st_size, reply.name
        assert await m.fails("lookup", control.st_ino, b"nope", ROOT_CTX) == errno.ENOENT
        assert json.loads(await m.read_path(f"{CONTROL_DIR}/config.json"))["metadata_ttl"] == TTL
        # stats.json: rendered by the lookup that sizes it; its open and reads get those bytes
        m.now += REUSE + 1
        await m.fails("getxattr", ROOT_INODE, b"trusted.x", ROOT_CTX)
        entry = await m.lookup(control.st_ino, "stats.json")
        sent, got = m.sent.copy(), m.got.copy()
        m.now += REUSE / 2  # the open after the stat, within REUSE: the same document
        doc = json.loads(await m.read_all(entry.st_ino))
        assert doc["requests"] == dict(sent)
        assert doc["errors"] == dict(got)
        assert doc["open"]["inodes"] == len(m.ops.inodes)
        assert doc["caches"]["metadata"]["misses"] == m.catalog.misses > 0
        # a while later, a fresh document with the requests made since
        m.now += REUSE + 1
        doc = json.loads(await m.read_all(entry.st_ino))
        assert doc["requests"]["read"] > sent["read"]
        metrics = (await m.read_path(f"{CONTROL_DIR}/metrics")).decode()
        assert f'h5mount_fuse_requests_total{{op="lookup"}} {m.ops.requests["lookup"]}' \
            in metrics
    run(main)


def test_control_name_is_reserved_at_the_root() -> None:
    """A root entry of storage named ``.h5mount`` is hidden by the control
    directory: lookups give the control directory, and no listing shows it."""
    async def main() -> None:
        catalog = sample_catalog()
        catalog.folders[""] = ["home", CONTROL_DIR]
        catalog.folders[CONTROL_DIR] = []
        m = await mount(catalog)
        control = await m.lookup(ROOT_INODE, CONTROL_DIR)
        names = await m.listdir(await m.ino(CONTROL_DIR))
        assert sorted(r.name for r in names) == ["config.json", "metrics", "stats.json"]
        listed = {r.name: r.ino for r in await m.listdir(ROOT_INODE)}
        assert listed.get(CONTROL_DIR, control.st_ino) == control.st_ino
        assert CONTROL_DIR not in listed
    run(main)


# --------------------------------------------------------------------------- ACLs


def test_hsds_acls_refuse_other_users() -> None:
    async def main() -> None:
        catalog = sample_catalog()
        domain = catalog.domains["home/u/f.h5"]
        catalog.domains["home/u/f.h5"] = Domain(domain.path, domain.root_id, domain.modified,
                                                {"owner": "root", "acls": {
                                                    "root": {"read": True},
                                                    "default": {"read": False}}})
        m = await mount(catalog, acls=AclPolicy())
        u = await m.ino("home/u")
        stranger = Caller(uid=98765)  # no passwd entry: the HSDS user "98765"
        mine = await m.lookup(u, "f.h5")
        theirs = await m.lookup(u, "f.h5", stranger)
        assert theirs.st_ino == mine.st_ino
        assert is_mode(mine, DIR_MODE) and mine.attr_timeout == 0  # per user: not kept
        assert theirs.st_mode == stat.S_IFDIR and theirs.attr_timeout == 0
        sidecar = await m.lookup(u, "f.h5.json", stranger)
        assert sidecar.st_mode == stat.S_IFREG
        for name, args in [("opendir", (mine.st_ino, stranger)),
                           ("lookup", (mine.st_ino, b"g1", stranger)),
                           ("open", (sidecar.st_ino, os.O_RDONLY, stranger)),
                           ("getxattr", (mine.st_ino, b"user.h5.id", stranger)),
                           ("listxattr", (mine.st_ino, stranger))]:
            assert await m.fails(name, *args) == errno.EACCES, name
        # the other domain has no ACLs; the owner reads this one
        assert is_mode(await m.lookup(u, "g.h5", stranger), DIR_MODE)
        assert json.loads(await m.read_path("home/u/f.h5.json"))["kind"] == "group"
    run(main)


# --------------------------------------------------------------------------- drain


def test_drain_lets_requests_under_way_finish_and_fails_new_ones() -> None:
    async def main() -> None:
        catalog = sample_catalog()
        dset = catalog.objects["d-1"]
        store = FaultyChunks(dict(dset.store.chunks))  # type: ignore[union-attr]
        store.slow.add((1, 1))
        object.__setattr__(dset, "store", store)
        m = await mount(catalog)
        chunk = await m.ino("home/u/f.h5/g1/dset/1.1")
        info = await m.call("open", chunk, os.O_RDONLY, ROOT_CTX)
        got: list[bytes] = []
        drained = trio.Event()

        async def slow_read() -> None:
            got.append(bytes(await m.call("read", info.fh, 0, 1 << 16)))

        async def drain() -> None:
            await m.ops.drain(5.0)
            drained.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_read)
            await trio.testing.wait_all_tasks_blocked()
            assert m.ops.in_flight == 1
            nursery.start_soon(drain)
            await trio.testing.wait_all_tasks_blocked()
            assert await m.fails("lookup", ROOT_INODE, b"home", ROOT_CTX) == errno.EIO
            assert not drained.is_set()  # the read under way holds it
        assert drained.is_set()
        assert got == [store.chunks[(1, 1)]]
        for name, args in [("getattr", (ROOT_INODE, ROOT_CTX)), ("opendir", (ROOT_INODE,
                                                                             ROOT_CTX)),
                           ("read", (info.fh, 0, 10))]:
            assert await m.fails(name, *args) == errno.EIO, name
        assert m.ops.errors == m.got == {"EIO": 4}
        assert m.ops.requests == m.sent
    run(main, clock=trio.testing.MockClock(autojump_threshold=0))
