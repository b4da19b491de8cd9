"""``layouts.views._columns``: value text, CSV / JSON-lines / lines files, without FUSE.

Datasets are built in memory (``tests.modelcat``) with the HDF5 type JSON a
format gives (``layouts.formats.refs._types.type_json``, or written out for enums
and variable-length compounds). Toy views written as a convention would
write them (``BuiltFileView`` over ``csv_file``, ``jsonl_file`` and
``lines_file``) are registered with a real ``Tree``, so sizes and reads go
the way the daemon serves them; the CSV is read back with ``pandas.read_csv``
and the ``csv`` module. A 1,000,000-row table is streamed through a reader
with ``tracemalloc`` watching.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pandas as pd
import pytest
import trio

from layouts.errors import Corrupt
from layouts.formats.refs._types import type_json
from layouts.model import (
    ChunkIndex,
    Dataset,
    Domain,
    ElementType,
    Link,
    LinkKind,
    ObjectKind,
    VlenKind,
)
from layouts.views import _columns as columns
from layouts.views._api import ViewContext, ViewFile
from layouts.views._arrays import decode_chunk
from layouts.views._columns import BuiltFileView, Column, DatasetColumn, csv_file, field_columns
from mountd.cache.metacache import CachedCatalog
from mountd.errors import StorageError
from mountd.tree import Tree, build
from mountd.tree.nodes import DirNode, FileNode, Node, listed_stat
from tests.modelcat import MemoryCatalog, MemoryChunks, group

UTF8_JSON = {"class": "H5T_STRING", "charSet": "H5T_CSET_UTF8", "length": "H5T_VARIABLE"}


# --------------------------------------------------------------------------- datasets


def fixed(obj_id: str, values: np.ndarray, rows_per_chunk: int, hdf5: Any = None,
          stored: Sequence[int] | None = None, fill: Any = None) -> Dataset:
    """A dataset of ``values`` (fixed-size dtype) cut into chunks of rows."""
    dtype = values.dtype
    chunks = (rows_per_chunk, *values.shape[1:])
    blocks: dict[ChunkIndex, bytes] = {}
    for k in range(-(-values.shape[0] // rows_per_chunk)):
        if stored is not None and k not in stored:
            continue
        block = np.zeros(chunks, dtype)
        part = values[k * rows_per_chunk:(k + 1) * rows_per_chunk]
        block[:len(part)] = part
        blocks[(k, *(0,) * (values.ndim - 1))] = block.tobytes()
    etype = ElementType(dtype, dtype.str, hdf5 if hdf5 is not None else type_json(dtype))
    return Dataset(id=obj_id, shape=values.shape, maxshape=values.shape, type=etype,
                   chunks=chunks, fill_value=fill, store=MemoryChunks(blocks))


def vlen(obj_id: str, values: list[Any], rows_per_chunk: int, kind: VlenKind,
         hdf5: Any) -> Dataset:
    """A 1-D variable-length dataset (strings, or json2 compounds: lists)."""
    codec = {VlenKind.UTF8: numcodecs.VLenUTF8(), VlenKind.JSON: numcodecs.JSON()}[kind]
    blocks: dict[ChunkIndex, bytes] = {}
    for k in range(-(-len(values) // rows_per_chunk)):
        part = np.empty(rows_per_chunk, dtype=object)
        got = values[k * rows_per_chunk:(k + 1) * rows_per_chunk]
        part[:] = [*got, *[got[0]] * (rows_per_chunk - len(got))]
        blocks[(k,)] = bytes(codec.encode(part))
    etype = ElementType(np.dtype(object), kind.value, hdf5, vlen=kind)
    return Dataset(id=obj_id, shape=(len(values),), maxshape=(len(values),), type=etype,
                   chunks=(rows_per_chunk,), fill_value=None, store=MemoryChunks(blocks))


class Ctx:
    """The part of a context the columns use, over chunks in memory."""

    def __init__(self) -> None:
        self.chunk_reads = 0
        self.path = "/table"
        self.block_counts = None

    async def chunks(self, ds: Dataset, indices: list[ChunkIndex]) -> list[bytes | None]:
        self.chunk_reads += len(indices)
        return [await ds.read_chunk(index) for index in indices]

    def prefetch(self, ds: Dataset, indices: list[ChunkIndex]) -> int:
        """Nothing is started ahead: every chunk is read when a block needs it."""
        return 0

    def error(self, reason: str) -> Exception:
        return ValueError(reason)


def run(coro_fn: Any, *args: Any) -> Any:
    return trio.run(coro_fn, *args)


async def content(file: ViewFile, ctx: Any) -> bytes:
    reader = await file.open(ctx)
    return bytes(await reader.read(0, 1 << 30))


def csv_of(cols: Sequence[Column]) -> bytes:
    ctx = Ctx()
    return run(content, csv_file(cols), ctx)


def read_back(data: bytes, **kwargs: Any) -> pd.DataFrame:
    return pd.read_csv(io.BytesIO(data), **kwargs)


# --------------------------------------------------------------------------- quoting


ODD_TEXTS = ["plain", "", "a,b", 'say "hi"', "line\nbreak", "cr\rx", "crlf\r\n", " lead",
             "trail ", "\t", "é名 ok", '"', ",", "x" * 300]


def test_quoting_edge_cases() -> None:
    ds = vlen("d-s", ODD_TEXTS, 4, VlenKind.UTF8, UTF8_JSON)
    n = np.arange(len(ODD_TEXTS), dtype="<i4")
    data = csv_of([DatasetColumn(fixed("d-n", n, 5), "n"), DatasetColumn(ds, "odd, name")])
    text = data.decode()
    assert text.startswith('n,"odd, name"\n0,plain\n1,\n2,"a,b"\n3,"say ""hi"""\n')
    assert '"line\nbreak"' in text and '"cr\rx"' in text and '" lead"' in text
    assert '"trail "' in text and '"\t"' in text and "é名 ok\n" in text
    # the csv module and pandas read back every value
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == ["n", "odd, name"]
    assert [r[1] for r in rows[1:]] == ODD_TEXTS
    frame = read_back(data, keep_default_na=False, dtype={"odd, name": str})
    assert frame["odd, name"].tolist() == ODD_TEXTS
    assert frame["n"].tolist() == n.tolist()


def test_single_column_empty_value_is_not_a_blank_line() -> None:
    ds = vlen("d-s", ["a", "", "b"], 2, VlenKind.UTF8, UTF8_JSON)
    data = csv_of([DatasetColumn(ds, "s")])
    assert data == b's\na\n""\nb\n'
    assert read_back(data, keep_default_na=False)["s"].tolist() == ["a", "", "b"]


def test_bytes_that_are_not_utf8_are_replaced() -> None:
    values = np.array([b"ok", b"\xff\xfeab", "é".encode()], dtype="S6")
    data = csv_of([DatasetColumn(fixed("d-b", values, 2), "b")])
    assert data.decode() == "b\nok\n\ufffd\ufffdab\né\n"


# --------------------------------------------------------------------------- numbers


def float_values(dtype: str) -> np.ndarray:
    info = np.finfo(dtype)
    rng = np.random.default_rng(1)
    special = [0.0, -0.0, 0.1, 1 / 3, 1.0, -2.5, 1e16, 1e-7, np.nan, np.inf, -np.inf,
               float(info.max), float(-info.max), float(info.tiny), float(info.smallest_subnormal),
               float(info.eps)]
    scale = 10.0 ** rng.integers(-30 if dtype != "f2" else -4, 30 if dtype != "f2" else 4, 500)
    randoms = rng.standard_normal(500) * scale
    with np.errstate(over="ignore"):
        return np.concatenate([np.array(special, dtype), randoms.astype(dtype)])


@pytest.mark.parametrize("dtype", ["<f8", ">f8", "<f4", ">f4", "<f2"])
def test_floats_round_trip_through_pandas(dtype: str) -> None:
    values = float_values(dtype)
    data = csv_of([DatasetColumn(fixed("d-f", values, 64), "x")])
    lines = data.decode().splitlines()[1:]
    assert lines[8:11] == ["nan", "inf", "-inf"]
    back = read_back(data)["x"].to_numpy()
    assert back.dtype == np.float64
    np.testing.assert_array_equal(back.astype(dtype), values)  # NaN == NaN here
    assert math.copysign(1, back[1]) == -1  # -0.0 kept
    # shortest text of the value's own width
    for text, value in zip(lines[:8], values[:8], strict=True):
        assert text == str(value) or float(text) == float(str(value)), (text, value)
    if dtype[1:] == "f4":
        assert lines[2] == "0.1"


@pytest.mark.parametrize("dtype", ["i1", "<u2", ">i4", "<u4", ">i8", "<u8"])
def test_integers_exact(dtype: str) -> None:
    info = np.iinfo(dtype)
    values = np.array([info.min, -1 if info.min else 0, 0, 1, 7, info.max], dtype=dtype)
    data = csv_of([DatasetColumn(fixed("d-i", values, 4), "i")])
    assert data.decode().splitlines()[1:] == [str(int(v)) for v in values]
    back = read_back(data)["i"].to_numpy()
    assert back.tolist() == values.tolist()


def test_bools_enums_opaque_and_arrays() -> None:
    flags = np.array([True, False, True])
    enum_json = {"class": "H5T_ENUM", "base": {"class": "H5T_INTEGER", "base": "H5T_STD_I8LE"},
                 "mapping": {"RED": 0, "GREEN": 1, "BLUE, DARK": 42}}
    colors = fixed("d-e", np.array([0, 42, 7], dtype="i1"), 2, hdf5=enum_json)
    opaque = fixed("d-o", np.frombuffer(b"\x00\x01\x02\xff" * 3, "V4"), 2)
    grid = fixed("d-g", np.array([[1.5, np.nan], [np.inf, 0.1], [3, 4]], "<f4"), 2)
    cube = fixed("d-c", np.arange(12, dtype="<i2").reshape(3, 2, 2), 2)
    cols = [DatasetColumn(fixed("d-b", flags, 2), "flag"), DatasetColumn(colors, "color"),
            DatasetColumn(opaque, "raw"), DatasetColumn(grid, "grid"),
            DatasetColumn(cube, "cube")]
    data = csv_of(cols)
    assert data.decode().splitlines() == [
        "flag,color,raw,grid,cube",
        'True,RED,AAEC/w==,"[1.5,null]","[[0,1],[2,3]]"',
        'False,"BLUE, DARK",AAEC/w==,"[null,0.1]","[[4,5],[6,7]]"',
        'True,7,AAEC/w==,"[3.0,4.0]","[[8,9],[10,11]]"',
    ]
    frame = read_back(data)
    assert frame["flag"].dtype == bool and frame["flag"].tolist() == flags.tolist()
    assert [json.loads(v) for v in frame["cube"]] == cube_list()


def cube_list() -> list[Any]:
    return np.arange(12).reshape(3, 2, 2).tolist()


# --------------------------------------------------------------------------- compounds


POINT = np.dtype([("x", "<f4"), ("y", ">f8")])
RECORD = np.dtype([("id", "<i8"), ("name", "S8"), ("pos", POINT), ("v", "<i2", (3,)),
                   ("ok", "?")])


def records(n: int) -> np.ndarray:
    out = np.zeros(n, RECORD)
    out["id"] = np.arange(n) * 3 - 7
    out["name"] = [b"r%d,x" % i if i % 3 else b"r%d" % i for i in range(n)]
    out["pos"]["x"] = np.arange(n, dtype="<f4") / 7
    out["pos"]["y"] = np.arange(n) * 1e10 / 3
    out["v"] = np.arange(3 * n).reshape(n, 3)
    out["ok"] = np.arange(n) % 2 == 0
    return out


def test_field_columns_flatten_nested_compounds() -> None:
    values = records(50)
    cols = field_columns(fixed("d-r", values, 8))
    assert [c.header for c in cols] == ["id", "name", "pos.x", "pos.y", "v", "ok"]
    assert [c.plain for c in cols] == [True, False, True, True, False, True]
    ctx = Ctx()
    data = run(content, csv_file(cols), ctx)
    assert ctx.chunk_reads == 7  # every block read once for all six columns
    frame = read_back(data)
    assert frame["id"].tolist() == values["id"].tolist()
    assert frame["name"].tolist() == [b.decode() for b in values["name"]]
    np.testing.assert_array_equal(frame["pos.x"].to_numpy().astype("<f4"), values["pos"]["x"])
    np.testing.assert_array_equal(frame["pos.y"].to_numpy(), values["pos"]["y"])
    assert [json.loads(v) for v in frame["v"]] == values["v"].tolist()
    assert frame["ok"].tolist() == values["ok"].tolist()
    # a prefix for a table inside a bigger one
    assert [c.header for c in field_columns(fixed("d-r", values, 8), "t.")][:3] == [
        "t.id", "t.name", "t.pos.x"]


def test_variable_length_compound_fields() -> None:
    hdf5 = {"class": "H5T_COMPOUND", "fields": [
        {"name": "n", "type": "H5T_STD_I32LE"}, {"name": "s", "type": UTF8_JSON},
        {"name": "w", "type": {"class": "H5T_VLEN", "base": "H5T_IEEE_F64LE"}}]}
    rows = [[1, "first", [1.5, float("nan")]], [2, "", []], [3, "drittes ß, x", [2.0]]]
    ds = vlen("d-j", rows, 2, VlenKind.JSON, hdf5)
    cols = field_columns(ds)
    assert [c.header for c in cols] == ["n", "s", "w"]
    data = csv_of(cols)
    assert data.decode() == 'n,s,w\n1,first,"[1.5,null]"\n2,,[]\n3,"drittes ß, x",[2.0]\n'


def test_format_replaces_value_text() -> None:
    ds = fixed("d-i", np.array([0, 1, 2], dtype="<i4"), 2)
    col = DatasetColumn(ds, "label", format=lambda v: ["zero", "one", "two, three"][v])
    assert not col.plain
    assert csv_of([col]) == b'label\nzero\none\n"two, three"\n'


def test_unstored_chunks_read_as_fill() -> None:
    ds = fixed("d-f", np.arange(10, dtype="<f8"), 4, stored=[0, 2], fill=np.float64(-1))
    data = csv_of([DatasetColumn(ds, "x")])
    assert read_back(data)["x"].tolist() == [0, 1, 2, 3, -1, -1, -1, -1, 8, 9]


def test_columns_of_different_lengths_fail() -> None:
    a = DatasetColumn(fixed("d-a", np.arange(3, dtype="<i4"), 2), "a")
    b = DatasetColumn(fixed("d-b", np.arange(4, dtype="<i4"), 2), "b")
    with pytest.raises(ValueError, match="different lengths"):
        csv_of([a, b])


# --------------------------------------------------------------------------- jsonl, lines


async def json_rows(ctx: ViewContext, start: int, stop: int) -> list[Any]:
    out: list[Any] = []
    for i in range(start, stop):
        out.append({"i": i, "nan": float("nan"), "arr": np.arange(i % 3, dtype="<f4") / 3,
                    "big": 2**70 if i == 5 else i, "bytes": b"\xffx", "text": "é\n\"",
                    "np": np.int16(i), "inf": [np.float64("inf")]})
    return out


def test_jsonl_file() -> None:
    file = columns.jsonl_file(1000, json_rows, block_rows=300)
    ctx = Ctx()
    data = run(content, file, ctx)
    assert run(file.size, ctx) == len(data)
    lines = data.decode().split("\n")
    assert lines[-1] == "" and len(lines) == 1001
    docs = [json.loads(line) for line in lines[:-1]]
    assert docs[2] == {"i": 2, "nan": None, "arr": [0.0, pytest.approx(1 / 3)],
                       "big": 2, "bytes": "\ufffdx", "text": "é\n\"", "np": 2, "inf": [None]}
    assert docs[5]["big"] == 2**70 and docs[5]["nan"] is None
    assert "é" in lines[0] and " " not in lines[0]  # compact, not ASCII-escaped


def test_jsonl_wrong_count_fails() -> None:
    async def short(ctx: ViewContext, start: int, stop: int) -> list[Any]:
        return [1]

    with pytest.raises(ValueError, match="gave 1 values"):
        run(content, columns.jsonl_file(5, short), Ctx())


def test_lines_file() -> None:
    ds = vlen("d-s", ["a", "b c", "", "d,e"], 3, VlenKind.UTF8, UTF8_JSON)
    file = columns.lines_file(DatasetColumn(ds, "ignored"))
    assert run(content, file, Ctx()) == b"a\nb c\n\nd,e\n"


# --------------------------------------------------------------------------- through a tree


class CsvToy(BuiltFileView):
    """``P.csv``: a 1-D compound dataset's fields."""

    suffix = ".csv"

    async def applies(self, ctx: ViewContext) -> bool:
        ds = ctx.obj
        return isinstance(ds, Dataset) and ds.shape is not None and len(ds.shape) == 1 and (
            ds.type.dtype.names is not None)

    async def build(self, ctx: ViewContext) -> ViewFile:
        assert isinstance(ctx.obj, Dataset)
        return csv_file(field_columns(ctx.obj))


class JsonlToy(BuiltFileView):
    """``P.jsonl``: each row of a compound dataset as a JSON object."""

    suffix = ".jsonl"
    applies = CsvToy.applies

    async def build(self, ctx: ViewContext) -> ViewFile:
        ds = ctx.obj
        assert isinstance(ds, Dataset) and ds.shape
        cols = field_columns(ds)

        async def rows(ctx: ViewContext, start: int, stop: int) -> list[Any]:
            texts = [await c.texts(ctx, start, stop) for c in cols]
            return [dict(zip([c.header for c in cols], row, strict=True))
                    for row in zip(*texts, strict=True)]

        return columns.jsonl_file(ds.shape[0], rows, block_rows=7)


def make_tree(n: int) -> Tree:
    table = fixed("d-table", records(n), 16)
    objects = {"g-root": group("g-root", table=Link(LinkKind.HARD, "d-table",
                                                     target_kind=ObjectKind.DATASET)),
               "d-table": table}
    catalog = MemoryCatalog({"f.h5": Domain("f.h5", "g-root", 2.0, {})}, objects,
                            {"": ["f.h5"]}, single_domain="f.h5")
    return build.make_tree(CachedCatalog(catalog, ttl=60), views=[CsvToy(), JsonlToy()])


async def lookup(tree: Tree, name: str) -> Node:
    root = await tree.root()
    assert isinstance(root, DirNode)
    return await root.lookup(name)


def test_sizes_exact_and_random_reads_through_a_tree() -> None:
    async def main() -> None:
        tree = make_tree(300)
        for name in ("table.csv", "table.jsonl"):
            node = await lookup(tree, name)
            assert isinstance(node, FileNode)
            assert not (await listed_stat(node)).exact
            st = await node.stat()
            handle = await node.open()
            whole = bytes(await handle.read(0, 1 << 30))
            assert st.exact and st.size == len(whole)
            rng = np.random.default_rng(7)
            for _ in range(200):
                off = int(rng.integers(0, st.size + 10))
                size = int(rng.integers(1, 5000))
                got = bytes(await handle.read(off, size))
                assert got == whole[off:off + size], (name, off, size)
        csv_data = bytes(await (await (await lookup(tree, "table.csv")).open()).read(0, 1 << 30))
        frame = read_back(csv_data)
        assert frame["id"].tolist() == records(300)["id"].tolist()
    trio.run(main)


def test_errors_reach_the_reader_as_storage_errors() -> None:
    class Broken(CsvToy):
        async def build(self, ctx: ViewContext) -> ViewFile:
            ds = ctx.obj
            assert isinstance(ds, Dataset)
            return csv_file([*field_columns(ds), DatasetColumn(
                fixed("d-x", np.arange(3, dtype="i1"), 2), "short")])

    async def main() -> None:
        tree = make_tree(20)
        tree = build.make_tree(tree.catalog, views=[Broken()])
        node = await lookup(tree, "table.csv")
        with pytest.raises(StorageError, match="different lengths"):
            await node.stat()
    trio.run(main)


# --------------------------------------------------------------------------- scale


MILLION_ROWS = """
import os, sys
import numpy as np, trio
from layouts.views._columns import csv_file, field_columns
from tests.test_columns import Ctx, fixed

n = 1_000_000
table = np.zeros(n, np.dtype([("i", "<i8"), ("x", "<f8"), ("s", "S8"), ("t", "S16")]))
table["i"] = np.arange(n)
table["x"] = np.arange(n) / 7
table["s"] = np.array([b"s%d" % i for i in range(1000)], "S8")[np.arange(n) % 1000]
table["t"] = np.array([b"label, number %d" % i for i in range(77)], "S16")[np.arange(n) % 77]
file = csv_file(field_columns(fixed("d-big", table, 65536)))
del table
step = 128 << 10
page = os.sysconf("SC_PAGE_SIZE")
peak = 0

def rss():
    global peak
    with open("/proc/self/statm") as f:
        peak = max(peak, int(f.read().split()[1]) * page)

async def main():
    ctx = Ctx()
    stream = file.pieces(ctx)
    size = 0
    async for piece in stream:
        size += len(piece)
        rss()
    assert size == await file.size(ctx)
    reader = await file.open(ctx)
    head = bytes(await reader.read(0, 4096))
    total = 0
    while True:
        piece = bytes(await reader.read(total, step))
        total += len(piece)
        rss()
        if len(piece) < step:
            break
    tail = bytes(await reader.read(size - 39, 100))
    return size, total, head, tail, ctx.chunk_reads

rss()
before, peak = peak, 0
size, total, head, tail, reads = trio.run(main)
print(size, total, peak - before, reads)
sys.stdout.write(repr((head[:80], tail)))
"""


@pytest.mark.slow
def test_million_rows_with_bounded_memory() -> None:
    """A 1,000,000-row table (about 50 MB of CSV) is streamed, sized and read
    through with the process's resident memory, sampled after every piece and
    read, growing by a fraction of it."""
    done = subprocess.run([sys.executable, "-c", MILLION_ROWS], capture_output=True,
                          text=True, check=True, cwd=Path(__file__).parents[1], timeout=300)
    first, rest = done.stdout.split("\n", 1)
    size, total, grown, reads = map(int, first.split())
    head, tail = ast.literal_eval(rest)
    assert total == size > 45 << 20
    assert head.startswith(b"i,x,s,t\n0,0.0,s0,\"label, number 0\"\n1,0.14285714285714285,s1,")
    assert tail == b"999999,142857.0,s999,\"label, number 0\"\n"
    assert grown < 28 << 20, f"peak memory grew by {grown / 2**20:.1f} MiB"
    # a block's rows are read once for all four fields (8 blocks a chunk, 3 passes)
    assert reads <= 3 * 8 * -(-1_000_000 // 65536) + 3


def test_a_chunk_of_text_that_is_not_utf8_is_corrupt_not_a_crash() -> None:
    """A variable-length string chunk whose bytes are not UTF-8 (a damaged
    bucket) raises ``Corrupt`` (EIO for the reader), not ``UnicodeDecodeError``."""
    ds = vlen("d-bad", ["ok"], 1, VlenKind.UTF8, UTF8_JSON)
    with pytest.raises(Corrupt, match="does not decode as UTF8"):
        decode_chunk(ds, struct.pack("<II", 1, 2) + b"\xff\x9c")
    assert decode_chunk(ds, struct.pack("<II", 1, 2) + b"ok").tolist() == ["ok"]


def test_a_tables_reads_start_the_next_chunks_ahead_once_each() -> None:
    """Read in order (a count, a stream), a table's blocks start the chunks of
    the next ``AHEAD_CHUNK_ROWS`` rows of chunks in the background, each once,
    from the second on: with every one accepted, the chunks asked ahead are
    those after the second, in order, each asked for before its rows are
    read; the first chunk's blocks (what ``head`` reads) start none."""
    class Ahead(Ctx):
        def __init__(self) -> None:
            super().__init__()
            #: ("ask", index) and ("read", index), in the order they happened.
            self.events: list[tuple[str, ChunkIndex]] = []

        async def chunks(self, ds: Dataset, indices: list[ChunkIndex]) -> list[bytes | None]:
            self.events += [("read", index) for index in indices]
            return await super().chunks(ds, indices)

        def prefetch(self, ds: Dataset, indices: list[ChunkIndex]) -> int:
            self.events += [("ask", index) for index in indices]
            return len(indices)

    values = np.zeros(24_000, dtype=[("a", "<i4"), ("b", "<f8")])
    table = fixed("d-t", values, 2_000)
    ctx = Ahead()
    size = run(csv_file(field_columns(table)).size, ctx)
    assert size == len(csv_of(field_columns(table)))
    assert [index for what, index in ctx.events if what == "ask"] == [(k,) for k in range(2, 12)]
    for k in range(2, 12):
        assert ctx.events.index(("ask", (k,))) < ctx.events.index(("read", (k,)))
