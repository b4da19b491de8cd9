"""The folder tree of a bucket: folders, domains, and folder entries that are broken.

Owns ``FolderDir`` (an HSDS folder, or a plain directory of the bucket: its
folders, and its domains as group directories with their sidecars and
``D.h5`` file views beside them), ``BrokenDir`` (a folder entry whose
metadata cannot be read: listed, so the rest of the folder shows, but
failing every use) and ``SnapshotDir``, a directory listed whole.

Concurrency: nodes are immutable. Listing a folder probes its entries'
domains ``LIST_CONCURRENCY`` at a time; the catalog caches what it reads.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from layouts.model import Domain
from mountd.errors import MountError, NotFound
from mountd.tree.fanout import for_each
from mountd.tree.groups import GroupDir
from mountd.tree.h5view import SUFFIX as H5_SUFFIX
from mountd.tree.h5view import H5ViewFile
from mountd.tree.meta import sidecar_file
from mountd.tree.nodes import DirListing, DirNode, Node, NodeType, Row, SnapshotListing, Stat
from mountd.tree.paths import SIDECAR, root_path
from mountd.tree.preload import LIST_CONCURRENCY

if TYPE_CHECKING:
    from mountd.tree.core import Tree


class SnapshotDir(DirNode):
    """A directory whose listing is computed whole by ``listing()``."""

    @abstractmethod
    async def listing(self) -> list[Row]:
        """Every entry, in the order readdir shows them."""

    def open_listing(self) -> DirListing:
        return SnapshotListing(self.listing)

    async def lookup(self, name: str) -> Node:
        for entry_name, node, _ in await self.listing():
            if entry_name == name:
                return node
        raise NotFound(name)


class FolderDir(SnapshotDir):
    """An HSDS folder, or a plain directory of the bucket (``path`` "" is the top)."""

    def __init__(self, tree: Tree, path: str) -> None:
        self.tree = tree
        self.path = path

    @property
    def key(self) -> Hashable:
        return ("folder", self.path)

    async def stat(self) -> Stat:
        domain = await self.tree.catalog.domain(self.path) if self.path else None
        mtime, ctime = self.tree.stamps(domain)
        return Stat(NodeType.DIR, mtime=mtime, ctime=ctime)

    async def domain_info(self) -> Mapping[str, Any] | None:
        """The folder's own ``.domain.json`` metadata (None for the top)."""
        if not self.path:
            return None
        domain = await self.tree.catalog.domain(self.path)
        return None if domain is None else domain.info

    async def listing(self) -> list[Row]:
        names = await self.tree.catalog.list_folder(self.path)
        domains: dict[str, Domain | MountError | None] = {}

        async def probe(name: str) -> None:
            try:
                domains[name] = await self.tree.catalog.domain(self._child(name))
            except MountError as exc:
                domains[name] = exc

        await for_each(names, probe, LIST_CONCURRENCY)
        items: list[Row] = []
        real = set(names)
        for name in names:
            domain = domains[name]
            if isinstance(domain, MountError):
                items.append(Row(name, BrokenDir(self.tree, self._child(name))))
            elif domain is not None and domain.root_id is not None:
                op = root_path(domain)
                items.append(Row(name, GroupDir(self.tree, op)))
                if name + SIDECAR not in real:
                    items.append(Row(name + SIDECAR, sidecar_file(self.tree, op)))
                views = self.tree.h5views
                if views is not None and name + H5_SUFFIX not in real:
                    node = H5ViewFile(self.tree, views, domain)
                    items.append(Row(name + H5_SUFFIX, node, await node.listed()))
            else:
                items.append(Row(name, FolderDir(self.tree, self._child(name))))
        return items

    def _child(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path else name

    async def lookup(self, name: str) -> Node:
        names = await self.tree.catalog.list_folder(self.path)
        if name in names:
            domain = await self.tree.catalog.domain(self._child(name))
            if domain is not None and domain.root_id is not None:
                return GroupDir(self.tree, root_path(domain))
            return FolderDir(self.tree, self._child(name))
        if name.endswith(SIDECAR) and name[:-len(SIDECAR)] in names:
            domain = await self.tree.catalog.domain(self._child(name[:-len(SIDECAR)]))
            if domain is not None and domain.root_id is not None:
                return sidecar_file(self.tree, root_path(domain))
        views = self.tree.h5views
        if views is not None and name.endswith(H5_SUFFIX) and name[:-len(H5_SUFFIX)] in names:
            domain = await self.tree.catalog.domain(self._child(name[:-len(H5_SUFFIX)]))
            if domain is not None and domain.root_id is not None:
                return H5ViewFile(self.tree, views, domain)
        raise NotFound(name)


class BrokenDir(DirNode):
    """A folder entry whose ``.domain.json`` cannot be read: listed, so the
    rest of the folder shows, but every use gives that object's error (asked
    of the catalog again each time, so it ends with ``metadata_ttl``)."""

    def __init__(self, tree: Tree, path: str) -> None:
        self.tree = tree
        self.path = path

    @property
    def key(self) -> Hashable:
        return ("broken", self.path)

    async def _fail(self) -> MountError:
        """The domain's error now; NotFound once it reads (look it up again)."""
        try:
            await self.tree.catalog.domain(self.path)
        except MountError as exc:
            return exc
        return NotFound(self.path)

    async def stat(self) -> Stat:
        raise await self._fail()

    def open_listing(self) -> DirListing:
        async def fail() -> list[Row]:
            raise await self._fail()
        return SnapshotListing(fail)

    async def lookup(self, name: str) -> Node:
        raise await self._fail()
