"""``layouts.views._csvblock``: table text at array speed equals the text made value by value.

Hypothesis draws tables (integers of every width and byte order, float32
and float64 with NaN, infinities, subnormals and -0.0, bools, fixed-length
byte strings with quotes, commas, line breaks, edge white space, NUL and
bytes that are not ASCII, plus columns that have no cells: variable-length
strings, anndata's categorical and nullable columns), cut into chunks of
random rows. For each, the CSV and lines files
(``layouts.views._columns``) must give exactly the bytes of the reference
path, which joins each value's text made one by one (``Column.texts``, as
every block was made before this module), and their ``size`` must be the
length of those bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from layouts.model import VlenKind
from layouts.views import _columns as columns
from layouts.views import _csvblock
from layouts.views._columns import Column, DatasetColumn, csv_file, lines_file
from layouts.views._csvblock import block_bytes, block_size, cells, cells_of_texts
from layouts.views._csvjoin import join, scan
from layouts.views.anndata._elements import CategoricalColumn, NullableColumn
from tests.test_columns import UTF8_JSON, Ctx, content, fixed, vlen

NUMBER_DTYPES = ["i1", "u1", "<i2", ">u2", "<i4", ">i4", "<u4", "<i8", ">i8", "<u8", ">u8",
                 "<f4", ">f4", "<f8", ">f8", "?"]
#: Byte strings that stress quoting and the cells' checks.
ODD = [b"", b"a", b"a,b", b'q"q', b"x\ny", b"cr\r", b" lead", b"trail\t", b"\x1fx",
       b"mid\0nul", b"caf\xc3\xa9", b"\xff", b"0123456789"]


def reference(cols: Sequence[Column], ctx: Any, lines: bool = False) -> bytes:
    """The file as made value by value: each block's texts joined."""
    async def make() -> bytes:
        out = [] if lines else [columns.csv_line([c.header for c in cols]).encode()]
        block = max(1, min(c.block_rows(ctx) for c in cols))
        for start, stop in columns._blocks(cols[0].rows, block):
            fields = []
            for c in cols:
                texts = await c.texts(ctx, start, stop)
                fields.append(texts if c.plain or lines else columns._quoted_all(texts))
            if lines:
                out.append("".join(f"{t}\n" for t in fields[0]).encode("utf-8", "replace"))
            else:
                out.append(columns._encode(columns._lines(fields, stop - start)))
        return b"".join(out)
    return trio.run(make)


def produced(file: Any, ctx: Any) -> tuple[bytes, int]:
    async def both() -> tuple[bytes, int]:
        return await content(file, ctx), await file.size(ctx)
    return trio.run(both)


@st.composite
def number_column(draw: st.DrawFn, rows: int) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(NUMBER_DTYPES)))
    if dtype.kind == "f":
        elements = st.floats(width=8 * dtype.itemsize, allow_nan=True, allow_infinity=True,
                             allow_subnormal=True)
        return draw(hnp.arrays(dtype, rows, elements=elements))
    return draw(hnp.arrays(dtype, rows))


@st.composite
def bytes_column(draw: st.DrawFn, rows: int) -> np.ndarray:
    """Byte strings: any mix, or plain ones with at most one odd value among them
    (so the one value decides whether the block needs quoting)."""
    if draw(st.booleans()):
        pick = st.one_of(st.sampled_from(ODD), st.binary(max_size=6),
                         st.text(alphabet="abc ,\"", max_size=5).map(str.encode))
        values = [draw(pick) for _ in range(rows)]
    else:
        plain = st.text(alphabet="xyz019-", max_size=6).map(str.encode)
        values = [draw(plain) for _ in range(rows)]
        if draw(st.booleans()):
            values[draw(st.integers(0, rows - 1))] = draw(st.sampled_from(ODD))
    width = max(1, draw(st.integers(0, 3)) + max(len(v) for v in values))
    return np.array(values, dtype=f"S{width}")


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[Column], Any]:
    rows = draw(st.integers(1, 600))
    per_chunk = draw(st.integers(1, 300))
    count = draw(st.integers(1, 4))
    cols: list[Column] = []
    for i in range(count):
        kind = draw(st.sampled_from(["number", "number", "bytes", "text", "categorical",
                                     "nullable"]))
        if kind == "categorical":
            labels = draw(st.lists(st.text(max_size=5), min_size=1, max_size=8))
            codes = draw(hnp.arrays(np.int8, rows, elements=st.integers(-1, len(labels) - 1)))
            cols.append(CategoricalColumn(
                fixed(f"d-{i}", codes, per_chunk),
                vlen(f"d-{i}-l", labels, len(labels), VlenKind.UTF8, UTF8_JSON), f"k{i}"))
            continue
        if kind == "nullable":
            mask = draw(hnp.arrays(np.bool_, rows))
            cols.append(NullableColumn(fixed(f"d-{i}", draw(number_column(rows)), per_chunk),
                                       fixed(f"d-{i}-m", mask, per_chunk), f"n{i}"))
            continue
        if kind == "text":
            words = draw(st.lists(st.text(max_size=5), min_size=rows, max_size=rows))
            cols.append(DatasetColumn(vlen(f"d-{i}", words, per_chunk, VlenKind.UTF8,
                                           UTF8_JSON), f"t{i}"))
            continue
        values = draw(number_column(rows) if kind == "number" else bytes_column(rows))
        cols.append(DatasetColumn(fixed(f"d-{i}", values, per_chunk), f"c{i},{kind}"))
    return cols, Ctx()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_csv_equals_the_texts_made_one_by_one(table: tuple[list[Column], Any]) -> None:
    cols, ctx = table
    data, size = produced(csv_file(cols), ctx)
    assert data == reference(cols, ctx)
    assert size == len(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_lines_equal_the_texts_made_one_by_one(table: tuple[list[Column], Any]) -> None:
    cols, ctx = table
    data, size = produced(lines_file(cols[0]), ctx)
    assert data == reference(cols[:1], ctx, lines=True)
    assert size == len(data)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_rows_of_numbers_equal_their_json_made_row_by_row(data: st.DataObject) -> None:
    """``number_rows_file`` (one serialisation per block) gives the bytes of
    ``jsonl_file`` over the same rows in native byte order (one ``json_text``
    per row), empty rows and non-finite floats included, and its size is
    their length."""
    lengths = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=300))
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = data.draw(number_column(int(bounds[-1])))
    block = data.draw(st.integers(1, 50))

    async def numbers(ctx: Any, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        return values[bounds[start]:bounds[stop]], bounds[start:stop + 1] - bounds[start]

    native = values.astype(values.dtype.newbyteorder("="))  # as LEGEND's rows give them

    async def rows(ctx: Any, start: int, stop: int) -> list[Any]:
        return [native[a:b] for a, b in zip(bounds[start:stop], bounds[start + 1:stop + 1],
                                             strict=True)]

    ctx = Ctx()
    data_, size = produced(columns.number_rows_file(len(lengths), numbers, block_rows=block), ctx)
    assert data_ == produced(columns.jsonl_file(len(lengths), rows, block_rows=block), ctx)[0]
    assert size == len(data_)


@given(st.data())
def test_a_blocks_size_is_the_length_of_its_bytes(data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 200))
    made = []
    for _ in range(data.draw(st.integers(1, 5))):
        values = data.draw(number_column(rows) | bytes_column(rows))
        got = cells(values)
        if got is None:
            texts = [v.decode("latin-1") for v in values.tolist()] \
                if values.dtype.kind == "S" else [str(v) for v in values.tolist()]
            got = cells_of_texts(texts)
        if got is not None:
            made.append(got)
    if made:
        assert len(block_bytes(made)) == block_size(made)


@pytest.mark.parametrize("odd", ODD)
@pytest.mark.parametrize("where", [0, 3, 7])
def test_one_odd_byte_string_among_plain_ones(odd: bytes, where: int) -> None:
    """The one value decides whether the block needs quoting (or has no cells)."""
    values = [b"abc", b"x", b"12", b"", b"zz-9", b"q", b"w", b"e"]
    values[where] = odd
    array = np.array(values, dtype=f"S{max(len(v) for v in values) + 1}")
    for cols in ([DatasetColumn(fixed("d-b", array, 3), "b")],
                 [DatasetColumn(fixed("d-n", np.arange(8), 5), "n"),
                  DatasetColumn(fixed("d-b", array, 3), "b")]):
        ctx = Ctx()
        data, size = produced(csv_file(cols), ctx)
        assert data == reference(cols, ctx)
        assert size == len(data)


def test_non_finite_floats_alone_and_among_others() -> None:
    for values in ([np.nan, 1.0], [np.inf], [-np.inf, 2.0], [np.nan], [-np.nan, -np.inf],
                   [np.inf, np.nan, -np.inf, 0.5, -0.0]):
        for dtype in ("<f8", ">f4"):
            array = np.array(values, dtype)
            got = cells(array)
            assert got is not None
            expected = "".join(f"{t}\n" for t in columns._float_texts(array)).encode()
            assert block_bytes([got]) == expected
            assert block_size([got]) == len(expected)


def test_the_join_fills_exactly_the_size_counted() -> None:
    """``_csvjoin.join`` makes the lines of JSON arrays and NUL-padded
    matrices, eight bytes at a time or one (texts of 1 to 20 bytes, at the
    buffer's end or not), and refuses a count or an array that disagrees
    with them rather than give other bytes."""
    texts = [b"7", b"-12", b"0.1234567", b"123456789012345678", b"1e-7", b"3.25", b"nan\0",
             b"-inf", b"12345678901234567890"]
    array = b"[" + b",".join(texts) + b"]"
    names = np.array([b"ab", b"", b"cdefghij", b"k"] * 2 + [b"lmnopqrstu"], dtype="S10")
    want = b"".join(t.rstrip(b"\0") + b";" + n + b"\n" for t, n in zip(texts, names, strict=True))
    columns = [(array, 0), (names, 10)]
    assert join(columns, len(texts), len(want), b";", b"\n") == want
    for size in (len(want) - 1, len(want) + 1):
        with pytest.raises(ValueError, match="counted"):
            join(columns, len(texts), size, b";", b"\n")
    bad = [b"[1,2", b"1,2]", b"[1,2,3]", b"[1]", b"[1,\0x2]"]
    for buffer in bad:
        with pytest.raises(ValueError, match="array"):
            join([(buffer, 0)], 2, 4, b",", b"\n")
    with pytest.raises(ValueError, match="rows of"):
        join([(names, 10)], len(names) + 1, 100, b",", b"\n")


def test_the_scan_of_padded_texts() -> None:
    """``_csvjoin.scan`` measures NUL-padded texts, tells whether one needs
    quotes (a special byte anywhere, white space at an edge) or is empty, and
    refuses bytes that are not ASCII, a NUL inside a text and a bad shape."""
    def scanned(*values: bytes) -> tuple[int, bool, bool] | None:
        raw = np.array(values, dtype="S6")
        return scan(raw, len(raw), 6)

    assert scanned(b"ab", b"cdefgh") == (8, True, False)
    assert scanned(b"ab", b"") == (2, True, True)
    for odd in (b"a,b", b'q"', b"x\ny", b"cr\r", b" a", b"a\t", b"\x1fa"):
        assert scanned(b"ab", odd) == (2 + len(odd), False, False), odd
    assert scanned(b"a b") == (3, True, False)  # white space inside is plain
    assert scanned(b"\xc3\xa9") is None
    assert scanned(b"a\0b") is None
    with pytest.raises(ValueError, match="width"):
        scan(b"abc", 2, 2)
    with pytest.raises(ValueError, match="width"):
        scan(b"", 0, 0)


def test_which_kinds_have_cells() -> None:
    assert cells(np.array([1.5], dtype="<f2")) is None
    assert cells(np.array(["x"], dtype="U1")) is None
    assert cells(np.array([b"\xc3\xa9"], dtype="S2")) is None  # not ASCII
    assert cells(np.array([b"a\0b"], dtype="S3")) is None  # a NUL inside
    assert cells(np.zeros((2, 2), dtype="<i4")) is None
    quoted = cells(np.array([b"a,b", b"c"], dtype="S3"))
    assert quoted is not None and not quoted.plain
    assert cells_of_texts(["a\0"]) is None


def test_a_long_count_says_how_far_it_got(monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """With ``PROGRESS_SECONDS`` at 0 every block of the count is reported, then the total."""
    monkeypatch.setattr(_csvblock, "PROGRESS_SECONDS", 0.0)
    values = np.arange(3000, dtype="<i8")
    cols: list[Column] = [DatasetColumn(fixed("d-n", values, 1000), "n")]
    ctx = Ctx()
    with caplog.at_level(logging.INFO, logger=_csvblock.__name__):
        size = trio.run(csv_file(cols).size, ctx)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("/table: counting the size of its CSV view,") for line in lines)
    assert lines[-1].startswith(f"/table: its CSV view has {size} bytes (counted in ")
