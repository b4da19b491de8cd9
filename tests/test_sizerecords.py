"""``mountd.tree.sizerecords``: what a kept view size is validated by, and the disk round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import trio

from layouts.model import Attribute
from mountd.io.diskcache import DiskCache
from mountd.tree.sizerecords import SizeRecords
from tests.modelcat import dataset

VERSION = bytes(16)


def test_the_validator_changes_with_every_input() -> None:
    ds = dataset("d-1", np.arange(10, dtype="<i4"), (5,))
    base = SizeRecords.validator("view.Csv", ds, VERSION)
    assert SizeRecords.validator("view.Csv", ds, VERSION) == base
    assert SizeRecords.validator("view.Other", ds, VERSION) != base
    assert SizeRecords.validator("view.Csv", ds, b"\1" * 16) != base
    big = np.arange(5000.0)  # longer than numpy's shortened repr
    with_attr = dataclasses.replace(ds, attrs=(Attribute("a", big),))
    changed = big.copy()
    changed[2500] = -1
    other_attr = dataclasses.replace(ds, attrs=(Attribute("a", changed),))
    assert len({base, SizeRecords.validator("view.Csv", with_attr, VERSION),
                SizeRecords.validator("view.Csv", other_attr, VERSION)}) == 3
    # an array inside another value (a list), changed where numpy's repr would cut it short
    nested = dataclasses.replace(ds, attrs=(Attribute("a", [big]),))
    nested_other = dataclasses.replace(ds, attrs=(Attribute("a", [changed]),))
    assert SizeRecords.validator("view.Csv", nested, VERSION) != \
        SizeRecords.validator("view.Csv", nested_other, VERSION)


def test_a_size_is_read_back_only_under_its_validator(tmp_path: Path) -> None:
    async def main() -> None:
        records = SizeRecords(DiskCache(tmp_path, 1 << 20), "file:///bucket")
        await records.save("home/t.h5/tab.csv", "v1", 123_456_789_012)
        again = SizeRecords(DiskCache(tmp_path, 1 << 20), "file:///bucket")
        assert await again.load("home/t.h5/tab.csv", "v1") == 123_456_789_012
        assert await again.load("home/t.h5/tab.csv", "v2") is None
        assert await again.load("home/t.h5/other.csv", "v1") is None
        assert await SizeRecords(DiskCache(tmp_path, 1 << 20), "file:///elsewhere").load(
            "home/t.h5/tab.csv", "v1") is None
    trio.run(main)


def test_block_counts_are_read_back_only_under_their_validator(tmp_path: Path) -> None:
    """Digests are kept byte for byte (one ending in NUL bytes too); the
    blocks' validator ignores the shape (rows appended) but not the view,
    the attributes or the chunk shape."""
    ds = dataset("d-1", np.arange(10, dtype="<i4"), (5,))
    validator = SizeRecords.blocks_validator("view.Csv", ds)
    grown = dataset("d-1", np.arange(20, dtype="<i4"), (5,))
    assert SizeRecords.blocks_validator("view.Csv", grown) == validator
    assert SizeRecords.blocks_validator("view.Csv", dataset(
        "d-1", np.arange(10, dtype="<i4"), (2,))) != validator
    assert SizeRecords.blocks_validator("view.Lines", ds) != validator
    assert SizeRecords.blocks_validator("view.Csv", dataclasses.replace(
        ds, attrs=(Attribute("a", 1),))) != validator
    blocks = {(0, 5): (b"\1" * 8 + bytes(8), 40), (5, 10): (bytes(range(16)), 2**40)}

    async def main() -> None:
        records = SizeRecords(DiskCache(tmp_path, 1 << 20), "file:///bucket")
        await records.save_blocks("t.csv", validator, blocks)
        again = SizeRecords(DiskCache(tmp_path, 1 << 20), "file:///bucket")
        assert await again.load_blocks("t.csv", validator) == blocks
        assert await again.load_blocks("t.csv", "other") == {}
        assert await again.load("t.csv", validator) is None  # not a size
    trio.run(main)


def test_records_in_memory_alone_keep_within_their_budget() -> None:
    """Without ``cache_dir`` the records live in memory: the latest under each
    name, the least recently used dropped past the budget."""
    async def main() -> None:
        # Room for two records (24 bytes each, plus the memo's 200 of overhead), not three.
        records = SizeRecords(None, "", memory_bytes=500)
        await records.save("a.csv", "v1", 1)
        await records.save("a.csv", "v2", 2)  # replaces the name's record
        assert await records.load("a.csv", "v1") is None
        assert await records.load("a.csv", "v2") == 2
        await records.save("b.csv", "v1", 3)
        await records.save("c.csv", "v1", 4)  # over the budget: a.csv, least recently used, goes
        assert await records.load("a.csv", "v2") is None
        assert await records.load("b.csv", "v1") == 3
        assert await records.load("c.csv", "v1") == 4
    trio.run(main)
