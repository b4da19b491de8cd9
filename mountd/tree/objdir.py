"""The directory of one HDF5 object, and what every such directory shares.

Owns ``ObjectDir``: an object's directory by where it was reached
(``ObjPath``), with its times, its ``user.h5.*`` xattrs (memoised with the
object) and the hooks of loading ahead (``preload``, ``loaded``). A
committed datatype's directory is this, empty; groups
(``mountd.tree.groups``) and datasets (``mountd.tree.datasets``) list
their own entries.

Concurrency: nodes are immutable; what they derive is memoised in the
tree's memo by synchronous calls.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from mountd.errors import NotFound
from mountd.tree import sidecar
from mountd.tree.nodes import DirListing, DirNode, Node, NodeType, Row, SnapshotListing, Stat
from mountd.tree.paths import InDomain, ObjPath

if TYPE_CHECKING:
    from mountd.tree.core import Tree


class ObjectDir(InDomain, DirNode):
    """The directory of an HDF5 object (a committed datatype's is empty)."""

    __slots__ = ("key", "op", "tree")

    def __init__(self, tree: Tree, op: ObjPath) -> None:
        self.tree = tree
        self.op = op
        self.key: Hashable = ("dir", op.key)

    async def stat(self) -> Stat:
        mtime, ctime = self.tree.times(self.op, await self.tree.obj(self.op))
        return Stat(NodeType.DIR, mtime=mtime, ctime=ctime)

    async def xattrs(self) -> dict[str, bytes]:
        """The object's ``user.h5.*`` attributes (a shared dict: do not change it)."""
        obj = await self.tree.obj(self.op)
        key = ("xattrs", self.op.domain.path, obj.id)
        attrs: dict[str, bytes] | None = self.tree.memo.get(key, obj)
        if attrs is None:
            attrs = await sidecar.object_xattrs(obj, self.tree.refs.resolver(self.op.domain))
            self.tree.memo.put(key, attrs, sum(len(k) + len(v) for k, v in attrs.items()), obj)
        return attrs

    def open_listing(self) -> DirListing:
        return SnapshotListing(self._nothing)

    async def _nothing(self) -> list[Row]:
        await self.tree.obj(self.op)
        return []

    async def lookup(self, name: str) -> Node:
        await self.tree.obj(self.op)
        raise NotFound(name)

    async def preload(self) -> None:
        """Fetch, in the background, what listing this directory will need."""
        await self.tree.preload.fetch_object(self.op)

    def loaded(self) -> bool:
        """True if listing this directory needs no storage round trip now."""
        return self.tree.peek(self.op) is not None
