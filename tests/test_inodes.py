"""The inode table's lookup counts (``mountd.inodes``), which it stores only
where they are not 1: every count the kernel can reach is kept exactly."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from mountd.inodes import ROOT_INODE, InodeTable
from mountd.tree.nodes import Node, Stat


class _Node(Node):
    __slots__ = ("key",)

    def __init__(self, key: Hashable) -> None:
        self.key: Hashable = key

    async def stat(self) -> Stat:
        raise NotImplementedError


def test_counts_rise_and_fall_and_release_at_zero() -> None:
    table = InodeTable(_Node("root"))
    a = _Node("a")
    ino = table.inode_of(a)
    assert table.inode_of(_Node("a")) == ino and table.node(ino) is a  # one inode per key
    for _ in range(3):
        table.remember(ino)
    table.forget(ino, 2)
    assert table.node(ino) is a
    table.forget(ino, 1)
    assert table.node(ino) is None and len(table) == 1
    again = table.inode_of(_Node("a"))
    assert again != ino  # a new number after a release
    table.remember(again)
    table.forget(again, 5)  # more than it held: released, not negative
    assert table.node(again) is None


def test_an_inode_handed_out_but_never_counted_can_be_dropped() -> None:
    table = InodeTable(_Node("root"))
    ino = table.inode_of(_Node("b"))
    table.drop_if_unused(ino)
    assert table.node(ino) is None
    counted = table.inode_of(_Node("c"))
    table.remember(counted)
    table.drop_if_unused(counted)  # counted once: kept
    assert table.node(counted) is not None
    with pytest.raises(KeyError):
        table.remember(ino)


def test_the_root_is_never_released() -> None:
    table = InodeTable(_Node("root"))
    table.forget(ROOT_INODE, 10)
    table.drop_if_unused(ROOT_INODE)
    assert table.node(ROOT_INODE) is not None
    assert table.numbers() == [ROOT_INODE]
