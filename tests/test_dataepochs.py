"""Data epochs (mountd.cache.dataepochs): a dataset's cached chunks outlive a
period only while the version storage shows stays the same, and each
period's version is learnt once, before anything of the period is read."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import pytest
import trio

from mountd.cache.dataepochs import DataEpochs
from mountd.errors import StorageError


def in_trio(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body under ``trio.run``."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(test, *args, **kwargs))

    return run


class Versions:
    """A store's answers to ``version()``, counted."""

    def __init__(self, value: Hashable | None = "v1") -> None:
        self.value = value
        self.asked = 0
        self.fail = False

    async def __call__(self) -> Hashable | None:
        self.asked += 1
        await trio.sleep(0)
        if self.fail:
            raise StorageError("db/x", "listing failed")
        return self.value


@in_trio
async def test_an_unchanged_version_keeps_the_first_period() -> None:
    epochs, versions = DataEpochs(), Versions()
    assert await epochs.data_epoch("ds", 1, versions) == 1
    assert await epochs.data_epoch("ds", 2, versions) == 1
    assert await epochs.data_epoch("ds", 5, versions) == 1
    assert (versions.asked, epochs.learnt, epochs.kept) == (3, 3, 2)
    versions.value = "v2"  # a chunk changed
    assert await epochs.data_epoch("ds", 6, versions) == 6
    assert await epochs.data_epoch("ds", 7, versions) == 6
    assert epochs.known("ds", 7) == 6 and epochs.known("ds", 8) is None


@in_trio
async def test_a_period_learns_its_version_once_before_anyone_reads() -> None:
    epochs, versions = DataEpochs(), Versions()
    got: list[Hashable] = []

    async def reader() -> None:
        got.append(await epochs.data_epoch("ds", 1, versions))

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(reader)
    assert got == [1] * 10 and versions.asked == 1
    assert await epochs.data_epoch("ds", 1, versions) == 1 and versions.asked == 1


@pytest.mark.parametrize("unknown", ["none", "error"])
@in_trio
async def test_without_a_version_data_lasts_one_period(unknown: str) -> None:
    epochs = DataEpochs()
    versions = Versions(None)
    versions.fail = unknown == "error"
    assert [await epochs.data_epoch("ds", p, versions) for p in (1, 2, 3)] == [1, 2, 3]
    assert epochs.kept == 0
    # A version learnt later does not match the unknown one before it.
    versions.value, versions.fail = "v1", False
    assert await epochs.data_epoch("ds", 4, versions) == 4
    assert await epochs.data_epoch("ds", 5, versions) == 4


@in_trio
async def test_datasets_are_apart_and_bounded() -> None:
    epochs = DataEpochs(max_datasets=2)
    a, b, c = Versions("a"), Versions("b"), Versions("c")
    assert await epochs.data_epoch("a", 1, a) == 1
    assert await epochs.data_epoch("b", 2, b) == 2
    assert await epochs.data_epoch("a", 3, a) == 1
    assert await epochs.data_epoch("c", 4, c) == 4  # "b", used least lately, is forgotten
    assert await epochs.data_epoch("b", 5, b) == 5  # so its data starts afresh
    assert await epochs.data_epoch("c", 6, c) == 4
