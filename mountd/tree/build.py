"""Making a mount's tree: each part made once, before the parts that use it.

Owns ``make_tree`` and ``mount_root``: but for the node modules (which make
their children), the one module of the tree that names node classes, so
that ``mountd.tree.core`` imports none. The order is one way: the caller makes
the views first, none of which holds a tree (the conventions registered in
``layouts.views.VIEWS``, and the ``D.h5`` images, ``H5Views.for_mount``);
``make_tree`` hands them to the ``Tree`` it makes, with ``mount_root``; the
tree makes the root node with it when asked (``Tree.root``), and the
operations (``mountd.fuse_ops``) are made over that node. The tree and its
views are whole when made: nothing is set on them afterwards.

Concurrency: ``make_tree`` is synchronous and does no I/O; ``mount_root``
reads the catalog and makes a new node on each call.
"""

from __future__ import annotations

from collections.abc import Sequence

from layouts.model import Catalog
from layouts.views import View
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.memo import MAX_BYTES as MEMO_BYTES
from mountd.errors import NotFound
from mountd.tree.core import Tree
from mountd.tree.folders import FolderDir
from mountd.tree.groups import GroupDir
from mountd.tree.h5view import H5Views
from mountd.tree.nodes import DirNode
from mountd.tree.paths import root_path
from mountd.tree.sizerecords import SizeRecords


def make_tree(catalog: Catalog, views: Sequence[View] = (), ttl: float = 60.0,
              chunk_cache: ChunkCache | None = None,
              h5views: H5Views | None = None, *, memo_bytes: int = MEMO_BYTES,
              size_records: SizeRecords | None = None) -> Tree:
    """The tree of a mount of ``catalog``, showing ``views`` and, unless None,
    the ``D.h5`` images of ``h5views`` and view sizes kept on disk in
    ``size_records`` (``Tree`` says what the rest are)."""
    return Tree(catalog, views, ttl, chunk_cache, root=mount_root, h5views=h5views,
                memo_bytes=memo_bytes, size_records=size_records)


async def mount_root(tree: Tree) -> DirNode:
    """The node at the mount root: the root group of a mount of one domain,
    else the top folder."""
    single = tree.catalog.single_domain
    if single is None:
        return FolderDir(tree, "")
    domain = await tree.catalog.domain(single)
    if domain is None or domain.root_id is None:
        raise NotFound(single)
    return GroupDir(tree, root_path(domain), mount_root=True)
