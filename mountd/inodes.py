"""Inode numbers for tree nodes, with the kernel's lookup counts.

Owns the two maps inode -> node and node key -> inode, and the kernel's
lookup count of each inode. A node gets an inode the first time the kernel
sees it (lookup or readdir); the same key always maps to the same inode
while the kernel remembers it. When the kernel's lookup count drops to zero
(``forget``) the inode is released, and a later lookup of the same entry
gets a new number, which FUSE allows.

Concurrency: plain synchronous methods with no ``await``, so each call is
atomic with respect to other trio tasks. ``forget`` never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

from mountd.tree.nodes import Node

log = logging.getLogger(__name__)

ROOT_INODE = 1


class InodeTable:
    """Inode numbers of the nodes the kernel holds, with its lookup counts.

    A walk leaves the kernel holding several entries per object, nearly all
    looked up once, so a count is stored only where it is not 1
    (``_counts``): the table costs two dict entries per inode.
    """

    def __init__(self, root: Node) -> None:
        self._next = ROOT_INODE + 1
        self._nodes: dict[int, Node] = {ROOT_INODE: root}
        self._by_key: dict[Hashable, int] = {root.key: ROOT_INODE}
        #: Lookup counts other than 1, by inode.
        self._counts: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def numbers(self) -> list[int]:
        """Every inode the kernel may hold, the root's included."""
        return list(self._nodes)

    def node(self, ino: int) -> Node | None:
        return self._nodes.get(ino)

    def inode_of(self, node: Node) -> int:
        """The inode for ``node``, allocated with a lookup count of 0 if new."""
        ino = self._by_key.get(node.key)
        if ino is None:
            ino = self._next
            self._next += 1
            self._by_key[node.key] = ino
            self._nodes[ino] = node
            self._counts[ino] = 0
        return ino

    def remember(self, ino: int) -> None:
        """Count one kernel lookup of ``ino`` (KeyError if it is not in the table)."""
        if ino not in self._nodes:
            raise KeyError(ino)
        self._set_count(ino, self._counts.get(ino, 1) + 1)

    def drop_if_unused(self, ino: int) -> None:
        """Release an inode handed out but never counted (e.g. a refused readdir entry)."""
        if self._counts.get(ino) == 0 and ino != ROOT_INODE:
            self._release(ino)

    def forget(self, ino: int, count: int) -> None:
        if ino not in self._nodes or ino == ROOT_INODE:
            return
        left = self._counts.get(ino, 1) - count
        if left <= 0:
            self._release(ino)
        else:
            self._set_count(ino, left)

    def _set_count(self, ino: int, count: int) -> None:
        if count == 1:
            self._counts.pop(ino, None)
        else:
            self._counts[ino] = count

    def _release(self, ino: int) -> None:
        node = self._nodes.pop(ino)
        self._counts.pop(ino, None)
        if self._by_key.get(node.key) == ino:
            del self._by_key[node.key]
