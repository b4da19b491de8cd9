"""A group's directory: for each link ``P``, the entries ``P``, ``P.json`` and views.

Owns ``GroupDir``: the entries a group's links contribute (the child's
directory, its sidecar and the entries of the views that apply to it; a
symlink for a soft or external link, or a hard link back to an ancestor,
plus symlinks to the target's sidecar and views), the group's own files
(``.zattrs``, ``.zgroup``, and the mount root's ``.root.json`` and
``.root.h5``), and how names map to links: a lookup maps its name back to
the link in O(1) (a real link's name wins over a generated one), and a
listing gives the entries sorted by name, merged from the links sorted once
per suffix, with each name kept only where a lookup of it leads back to the
same link. No per-group index of names is kept or built. ``Symlink`` is a
link's node; ``object_dir`` makes the directory node for an object of a
given kind.

Listing a group fetches its children's objects ``LOAD_WINDOW`` entries at a
time and makes every entry with its stat, ``LIST_CONCURRENCY`` links at a
time. A group of up to ``STREAM_LINKS`` links is listed whole; a bigger one
is streamed (``SmallOrStreamListing``): its rows are made a window at a time
as the reader asks, so no map of its names or of its links' entries is ever
made whole. Either way the rows, kept flat, are memoised with the group
object once all are made, and checked before reuse against the child
objects they were made from; a group with soft, external or cyclic links is
listed afresh each time, as its symlink texts depend on other groups.
Listing a group tells the preloader the order of its child directories, and
listing one of them may load the next ones ahead.

Concurrency: nodes are immutable; the memo changes only in synchronous
calls; a streamed listing's state is its own generator's.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import AsyncIterator, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from layouts.model import AnyObject, Group, Link, LinkKind, ObjectKind
from mountd import logsafe
from mountd.errors import MountError, NotFound
from mountd.tree.datasets import DatasetDir
from mountd.tree.fanout import for_each
from mountd.tree.h5view import H5ViewFile
from mountd.tree.meta import ZATTRS_NAME, ZGROUP_NAME, sidecar_file, zattrs_file, zgroup_file
from mountd.tree.names import display_name, fits, unescape
from mountd.tree.nodes import (
    STREAM_BATCH,
    DirListing,
    FlatRows,
    Node,
    NodeType,
    Row,
    SmallOrStreamListing,
    Stat,
    SymlinkNode,
    listed_stat,
)
from mountd.tree.objdir import ObjectDir
from mountd.tree.paths import (
    ROOT_H5,
    ROOT_SIDECAR,
    SIDECAR,
    ObjPath,
    inside_text,
    relative,
    root_path,
)
from mountd.tree.preload import LIST_CONCURRENCY
from mountd.tree.viewctx import ObjectContext, shows
from mountd.tree.viewnodes import ViewFileNode

if TYPE_CHECKING:
    from mountd.tree.core import Tree

#: Children whose objects are fetched ahead when a group is loaded in the background.
PRELOAD_LINKS = 1000
#: Links past which a group's listing is streamed instead of made whole and memoised.
STREAM_LINKS = 4096
#: Entries of a listing whose objects are fetched together before their rows are made.
LOAD_WINDOW = 1024
#: Rough bytes one name of a group's long-name map costs, for the memo's budget.
_INDEX_ENTRY_BYTES = 200
#: Rough bytes one memoised readdir row costs beyond its node (which the inode
#: table holds anyway while the kernel knows the entry).
_ROW_BYTES = 160


def object_dir(tree: Tree, op: ObjPath, kind: ObjectKind) -> ObjectDir:
    if kind is ObjectKind.GROUP:
        return GroupDir(tree, op)
    if kind is ObjectKind.DATASET:
        return DatasetDir(tree, op)
    return ObjectDir(tree, op)


class Symlink(SymlinkNode):
    """A symlink with fixed text; ``times`` is its (mtime, ctime).

    It has no xattrs: Linux refuses ``user.*`` attributes on symlinks before
    asking the filesystem (ENODATA), so the link as stored is kept in the
    parent group's sidecar (``links``) instead.
    """

    __slots__ = ("_ctime", "_key", "_mtime", "_text")

    def __init__(self, key: Hashable, text: str, times: tuple[float, float]) -> None:
        self._key = key
        self._text = text
        self._mtime, self._ctime = times

    @property
    def key(self) -> Hashable:
        return self._key

    async def stat(self) -> Stat:
        return Stat(NodeType.SYMLINK, size=len(self._text.encode("utf-8", "surrogateescape")),
                    mtime=self._mtime, ctime=self._ctime)

    async def target(self) -> str:
        return self._text


@dataclass(frozen=True, slots=True)
class _Rows:
    """A group's readdir rows, kept flat; ``objects`` are the (id, object) pairs
    they were made from (None: not reusable)."""

    rows: FlatRows
    objects: list[tuple[str, AnyObject]] | None

    def dirs(self) -> list[tuple[Hashable, ObjectDir]]:
        """The child directories in order, by key (made when the readahead
        first sees these rows: it keeps its own index of them)."""
        return [(node.op.key, node) for node in self.rows.nodes()
                if isinstance(node, ObjectDir)]


class GroupDir(ObjectDir):
    """A group: for each link ``P``, the entries ``P``, ``P.json`` and views."""

    __slots__ = ("mount_root",)

    def __init__(self, tree: Tree, op: ObjPath, mount_root: bool = False) -> None:
        super().__init__(tree, op)
        self.mount_root = mount_root

    def _entry_names(self, group: Group) -> Iterator[tuple[str, str, str]]:
        """``(shown name, link name, suffix)`` of every name the group's links
        claim, sorted by shown name: the links sorted once per suffix (a list of
        references each; the names are made as the merge reaches them), each
        name kept where ``_find`` leads back to the same link and suffix. A
        claimed name whose view does not apply to its object shows nothing."""
        links = group.links

        def claims(suffix: str) -> Iterator[tuple[str, str, str]]:
            for name in sorted(links, key=lambda name: display_name(name, suffix)):
                yield display_name(name, suffix), name, suffix

        for shown, name, suffix in heapq.merge(*map(claims, ("", *self.tree.entry_suffixes))):
            if suffix == "" or self._find(group, shown) == (name, suffix):
                yield shown, name, suffix

    def _find(self, group: Group, name: str) -> tuple[str, str] | None:
        """The (link name, suffix) of the entry shown as ``name``, a real link's
        name winning over a generated one, in O(1) with no index: the name is
        mapped back to its link (``names.unescape``); only a cut and hashed
        long name needs the small map of the group's long names (``_long_names``)."""
        links = group.links
        raw = unescape(name)
        if raw is not None and raw in links and display_name(raw) == name:
            return raw, ""
        for suffix in self.tree.entry_suffixes:
            if name.endswith(suffix):
                raw = unescape(name[:-len(suffix)])
                if raw is not None and raw in links and display_name(raw, suffix) == name:
                    return raw, suffix
        return self._long_names(group).get(name)

    def _long_names(self, group: Group) -> dict[str, tuple[str, str]]:
        """The entries of the links whose names are cut and hashed with some
        suffix, by shown name (memoised with the group object; few groups have
        any, and a lookup of an ordinary name never gets here for one that does)."""
        key = ("long", self.op.domain.path, group.id)
        found: dict[str, tuple[str, str]] | None = self.tree.memo.get(key, group)
        if found is not None:
            return found
        suffixes = self.tree.entry_suffixes
        longest = max(len(suffix.encode()) for suffix in suffixes)
        found = {}
        long_links = sorted(name for name in group.links if not fits(name, longest))
        for name in long_links:
            for suffix in suffixes:
                found.setdefault(display_name(name, suffix), (name, suffix))
        for name in long_links:
            found[display_name(name)] = (name, "")
        self.tree.memo.put(key, found, _INDEX_ENTRY_BYTES * len(found), group)
        return found

    def open_listing(self) -> DirListing:
        return SmallOrStreamListing(self._whole, self._batches)

    async def _whole(self) -> Sequence[Row] | None:
        """Every entry with its stat, if the rows are memoised and current or
        the group has at most ``STREAM_LINKS`` links; else None: stream them
        (``_batches``)."""
        group = await self.tree.group(self.op)
        self.tree.preload.dir_opened(self)
        rows = self._kept(group)
        if rows is None:
            if len(group.links) > STREAM_LINKS:
                return None
            made = FlatRows()
            async for batch in self._row_batches(group):
                made.extend(batch)
            rows = self._keep(group, made)
        self.tree.preload.remember(self.op.key, rows, rows.dirs)
        return rows.rows

    async def _batches(self) -> AsyncIterator[list[Row]]:
        """The rows of a group too big to list whole, as ``_row_batches`` makes
        them, kept flat as they go; once all are made, memoised (``_keep``)
        and the order of its child directories given to the preloader."""
        group = await self.tree.group(self.op)
        made = FlatRows()
        async for batch in self._row_batches(group):
            made.extend(batch)
            yield batch
        rows = self._keep(group, made)
        self.tree.preload.remember(self.op.key, rows, rows.dirs)

    def _kept(self, group: Group) -> _Rows | None:
        """The memoised rows of the group, if still current: checked against
        the child objects they were made from (one dict lookup each, no I/O)."""
        rows: _Rows | None = self.tree.memo.get(("rows", self.op.key), group, self.op.domain)
        if rows is None or not self.tree.all_fresh(self.op.domain, rows.objects):
            return None
        return rows

    def _keep(self, group: Group, made: FlatRows) -> _Rows:
        """The rows made for the group, memoised unless it has soft, external or
        cyclic links (their symlink texts depend on other groups) or a child
        object was not loaded (an error: the rows are made again next time).
        Each hard link to a child shows the child's directory (a real link's
        name always wins), and every other link a symlink, so the rows' object
        directories are the children, one for each link when all are."""
        children = [node for node in made.nodes() if isinstance(node, ObjectDir)]
        objects: list[tuple[str, AnyObject]] | None = None
        if len(children) == len(group.links):
            objects = []
            for child in children:
                obj = self.tree.peek(child.op)
                if obj is None:
                    objects = None
                    break
                objects.append((child.op.id, obj))
        rows = _Rows(made, objects)
        if objects is not None:
            self.tree.memo.put(("rows", self.op.key), rows, _ROW_BYTES * len(made),
                               group, self.op.domain)
        return rows

    async def _row_batches(self, group: Group) -> AsyncIterator[list[Row]]:
        """Every entry with its stat, in batches of at most ``STREAM_BATCH``: the
        group's own files, then the links' entries sorted by name. The objects
        of ``LOAD_WINDOW`` entries are fetched together, then their rows made."""
        own = [Row(name, node, await listed_stat(node))
               for name, node in self._own_files().items() if self._find(group, name) is None]
        if own:
            yield own
        times = self.tree.times(self.op, group)
        names = self._entry_names(group)
        while window := list(itertools.islice(names, LOAD_WINDOW)):
            links = list(dict.fromkeys(name for _, name, _ in window))
            per_link = await self._entries_of(group, links, times)
            rows: list[Row] = []
            for shown, name, suffix in window:
                node = per_link[name].get(suffix)
                if node is not None:
                    rows.append(Row(shown, node, await listed_stat(node)))
            for start in range(0, len(rows), STREAM_BATCH):
                yield rows[start:start + STREAM_BATCH]

    async def _entries_of(self, group: Group, links: list[str], times: tuple[float, float]
                          ) -> dict[str, dict[str, Node]]:
        """The entries of each of the group's ``links`` for a listing, by link
        name, their objects fetched first, together."""
        await self.tree.load_objects(self.op.domain, list(self._child_ids(group, links)))
        per_link: dict[str, dict[str, Node]] = {}

        async def fill(name: str) -> None:
            per_link[name] = await self._link_entries(name, group.links[name], times, True)

        await for_each(links, fill, LIST_CONCURRENCY)
        return per_link

    def _child_ids(self, group: Group, names: Iterable[str]) -> Iterator[str]:
        """The ids of the children the hard links ``names`` of the group lead
        to, leaving out links back to an ancestor."""
        for name in names:
            link = group.links[name]
            if link.kind is LinkKind.HARD and self.op.ancestor(link.target) is None:
                yield link.target

    def loaded(self) -> bool:
        """True once the group's rows are made and still current."""
        group = self.tree.peek(self.op)
        return isinstance(group, Group) and self._kept(group) is not None

    async def preload(self) -> None:
        """Fetch the group and the objects of its first ``PRELOAD_LINKS`` children."""
        async with self.tree.preload.limiter:
            group = await self.tree.group(self.op)
        await self.tree.load_objects(
            self.op.domain, list(itertools.islice(self._child_ids(group, group.links),
                                                  PRELOAD_LINKS)))

    async def lookup(self, name: str) -> Node:
        group = await self.tree.group(self.op)
        found = self._find(group, name)
        if found is None:
            own = self._own_files().get(name)
            if own is None:
                raise NotFound(name)
            return own
        link_name, suffix = found
        times = self.tree.times(self.op, group)
        entries = await self._link_entries(link_name, group.links[link_name], times, False)
        node = entries.get(suffix)
        if node is None:
            raise NotFound(name)
        return node

    def _own_files(self) -> dict[str, Node]:
        """Files of the group itself: zarr metadata, and the mount root's sidecar."""
        files: dict[str, Node] = {}
        if self.mount_root:
            files[ROOT_SIDECAR] = sidecar_file(self.tree, self.op)
            if self.tree.h5views is not None:
                files[ROOT_H5] = H5ViewFile(self.tree, self.tree.h5views, self.op.domain)
        files[ZATTRS_NAME] = zattrs_file(self.tree, self.op)
        files[ZGROUP_NAME] = zgroup_file(self.tree, self.op)
        return files

    async def _link_entries(self, name: str, link: Link, times: tuple[float, float],
                            listing: bool) -> dict[str, Node]:
        """The entries one link contributes, by suffix (``""`` is the link itself),
        for a ``listing`` or a lookup. Symlinks get the group's ``times`` (the
        model has no times of links)."""
        if link.kind is LinkKind.HARD and self.op.ancestor(link.target) is None:
            return await self._object_entries(self.op.child(name, link.target), link, listing)
        tree = self.tree
        if link.kind is LinkKind.HARD:
            target = self.op.ancestor(link.target)
        elif link.kind is LinkKind.SOFT:
            target = await tree.links.resolve(self.op, link.target)
        else:
            domain = await tree.links.external_domain(self.op.domain, link)
            target = (None if domain is None
                      else await tree.links.resolve(root_path(domain), link.target))
        here = tree.places.dir_location(self.op)
        if target is None:
            if link.kind is LinkKind.SOFT:
                text = relative(tree.places.h5_location(self.op, link.target), here)
            else:
                text = inside_text(logsafe.redact(f"{link.domain}::{link.target}"))
            return {"": Symlink(("link", self.op.key, name), text, times)}
        entries: dict[str, Node] = {
            "": Symlink(("link", self.op.key, name),
                        relative(tree.places.dir_location(target), here), times),
        }
        try:
            obj = await tree.obj(target)
        except MountError:
            return entries
        ctx = ObjectContext(tree, target, obj)
        suffixes = [SIDECAR, *[view.suffix for view in tree.entry_views if await shows(view, ctx)]]
        for suffix in suffixes:
            location = tree.places.file_location(target, suffix)
            entries[suffix] = Symlink(("link", self.op.key, name, suffix),
                                      relative(location, here), times)
        return entries

    async def _object_entries(self, op: ObjPath, link: Link, listing: bool) -> dict[str, Node]:
        """The object's directory, sidecar and views. The object is fetched when
        the views or its kind need it, and always for a ``listing``: readdir
        stats every entry next, so the listing fetches its children concurrently."""
        kind = link.target_kind
        obj: AnyObject | None = None
        if listing or kind is None or self.tree.entry_views:
            try:
                obj = await self.tree.obj(op)
                kind = obj.kind
            except MountError:
                if kind is None:
                    kind = ObjectKind.GROUP
        entries: dict[str, Node] = {
            "": object_dir(self.tree, op, kind),
            SIDECAR: sidecar_file(self.tree, op),
        }
        if obj is not None:
            ctx = ObjectContext(self.tree, op, obj)
            for view in self.tree.entry_views:
                if await shows(view, ctx):
                    entries[view.suffix] = ViewFileNode(self.tree, op, view)
        return entries
