"""The garbage collector's policy (``mountd.gcpolicy``), with the real collector.

Each test installs a ``Freezer`` with automatic collection off (so only the
test's own ``gc.collect`` calls run it), and removes it, leaving nothing
frozen: the rest of the session's collections are CPython's own.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from mountd.gcpolicy import FIRST_THAW, Freezer


class Cycle:
    """An object in a reference cycle with itself: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def freezer() -> Iterator[Freezer]:
    installed = Freezer()
    gc.disable()
    gc.callbacks.append(installed)
    try:
        yield installed
    finally:
        gc.callbacks.remove(installed)
        gc.unfreeze()
        gc.enable()


def test_survivors_of_a_collection_are_frozen_and_later_ones_scan_only_the_new(
        freezer: Freezer) -> None:
    kept = [[i] for i in range(10_000)]
    gc.collect(0)
    frozen = gc.get_freeze_count()
    assert frozen >= len(kept)
    # no generation holds them now: no later collection scans them
    scanned = {id(obj) for obj in gc.get_objects()}
    assert not any(id(item) in scanned for item in kept)
    del kept
    assert freezer.frozen == 1 and not freezer.thawed


def test_cyclic_garbage_among_frozen_objects_is_collected_after_a_thaw(
        freezer: Freezer) -> None:
    cycles = [Cycle() for _ in range(100)]
    gc.collect(0)
    assert freezer.frozen == 1
    del cycles  # now garbage, but frozen: no young collection sees it
    assert gc.collect(0) < 100
    while not freezer.thawed:
        gc.collect(0)
    assert freezer.frozen == 0 and freezer.thaws == 1
    assert gc.get_freeze_count() == 0
    # the full collection CPython then runs frees the cycles, and freezing resumes
    assert gc.collect() >= 100
    assert not freezer.thawed and gc.get_freeze_count() > 0


def test_thaws_come_after_twice_as_many_collections_each_time(freezer: Freezer) -> None:
    counts = []
    for _ in range(3):
        collections = 0
        while not freezer.thawed:
            gc.collect(0)
            collections += 1
        counts.append(collections)
        gc.collect()
    assert counts == [FIRST_THAW, 2 * FIRST_THAW, 4 * FIRST_THAW]
