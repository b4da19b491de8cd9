"""Inode numbers for tree nodes, with the kernel's lookup counts.

Owns the two maps inode -> node and node key -> inode. A node gets an inode
the first time the kernel sees it (lookup or readdir); the same key always
maps to the same inode while the kernel remembers it. When the kernel's
lookup count drops to zero (``forget``) the inode is released, and a later
lookup of the same entry gets a new number, which FUSE allows.

Concurrency: plain synchronous methods with no ``await``, so each call is
atomic with respect to other trio tasks. ``forget`` never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass

from mountd.tree.nodes import Node

log = logging.getLogger(__name__)

ROOT_INODE = 1


@dataclass(slots=True)
class _Slot:
    node: Node
    lookups: int


class InodeTable:
    def __init__(self, root: Node) -> None:
        self._next = ROOT_INODE + 1
        self._by_ino: dict[int, _Slot] = {ROOT_INODE: _Slot(root, 1)}
        self._by_key: dict[Hashable, int] = {root.key: ROOT_INODE}

    def __len__(self) -> int:
        return len(self._by_ino)

    def numbers(self) -> list[int]:
        """Every inode the kernel may hold, the root's included."""
        return list(self._by_ino)

    def node(self, ino: int) -> Node | None:
        slot = self._by_ino.get(ino)
        return None if slot is None else slot.node

    def inode_of(self, node: Node) -> int:
        """The inode for ``node``, allocated with a lookup count of 0 if new."""
        ino = self._by_key.get(node.key)
        if ino is None:
            ino = self._next
            self._next += 1
            self._by_key[node.key] = ino
            self._by_ino[ino] = _Slot(node, 0)
        return ino

    def remember(self, ino: int) -> None:
        """Count one kernel lookup of ``ino``."""
        self._by_ino[ino].lookups += 1

    def drop_if_unused(self, ino: int) -> None:
        """Release an inode handed out but never counted (e.g. a refused readdir entry)."""
        slot = self._by_ino.get(ino)
        if slot is not None and slot.lookups == 0 and ino != ROOT_INODE:
            self._release(ino, slot)

    def forget(self, ino: int, count: int) -> None:
        slot = self._by_ino.get(ino)
        if slot is None or ino == ROOT_INODE:
            return
        slot.lookups -= count
        if slot.lookups <= 0:
            self._release(ino, slot)

    def _release(self, ino: int, slot: _Slot) -> None:
        del self._by_ino[ino]
        if self._by_key.get(slot.node.key) == ino:
            del self._by_key[slot.node.key]
