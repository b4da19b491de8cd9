"""Blocks of table text at array speed: lengths for sizes, bytes for lines.

Owns ``Cells``, the texts of one column over a block of rows kept as arrays:
their total length in bytes, and on demand their bytes in one buffer
(``Texts``: a JSON array of numbers as orjson writes it, or a byte matrix
holding each text left-aligned and padded with NUL bytes). ``cells`` makes
them for the value kinds it can do without a Python object per value;
``cells_of_texts`` from texts made one by one. ``block_size`` counts the
bytes of a block of lines from the total lengths alone, and ``block_bytes``
joins the same texts into lines (each row's fields joined by ``sep`` and
ended by ``end``) in C (``layouts.views._csvjoin``), in a buffer of the
counted size that the lines must fill exactly: a block's count and its
bytes come from the same cells and are checked against each other.
``BlockedFile`` is a streamed file of such blocks (CSV, lines and Matrix
Market files), sized by counting them.

Texts are those of ``layouts.views._columns`` (whose CSV, lines and tests
define them): integers as orjson writes them; ``float32`` and ``float64`` as
orjson's shortest round trip of their own width, NaN and infinities as
``nan``, ``inf`` and ``-inf``; bools as ``True``/``False``; fixed-length
byte strings as their bytes when every value is ASCII with no NUL inside.
``cells`` answers None for anything else (enum members, other float widths,
strings that are not ASCII, objects), and the caller makes the texts one by
one. ``Cells.plain`` tells whether no text needs CSV quoting.

Stateless functions and files; a ``Cells`` is built once and then only read
(its bytes are made at most once, by whichever caller asks first), so it
may be shared by the tasks of one stream. The join runs without the GIL.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from layouts.model import Dataset
from layouts.views._api import ViewContext
from layouts.views._csvjoin import join, scan
from layouts.views._stream import StreamedFile, close_stream

log = logging.getLogger(__name__)

#: Seconds between two log lines of a size being counted.
PROGRESS_SECONDS = 10.0
_COMMA = ord(",")


#: A column's texts as ``layouts.views._csvjoin`` takes them: a buffer and its
#: row width (0: a JSON array of numbers as orjson writes it).
Texts = tuple[bytes | np.ndarray, int]


class Cells:
    """The texts of one column over a block of rows (see the module docstring):
    their total length always, their bytes (``Texts``) when asked, made once,
    by whichever caller asks first."""

    __slots__ = ("_texts", "empty", "plain", "rows", "total")

    def __init__(self, rows: int, total: int, *, plain: bool, empty: bool,
                 texts: Texts | Callable[[], Texts]) -> None:
        self.rows = rows
        #: The texts' lengths in bytes, added up.
        self.total = total
        #: True when no text needs CSV quoting; True when some text is empty.
        self.plain = plain
        self.empty = empty
        self._texts = texts

    def __len__(self) -> int:
        return self.rows

    def texts(self) -> Texts:
        """The texts, as ``layouts.views._csvjoin.join`` takes a column."""
        if callable(self._texts):
            self._texts = self._texts()
        return self._texts


def _fixed(raw: np.ndarray, lengths: np.ndarray, plain: bool) -> Cells:
    """Cells of a C-contiguous fixed-width bytes array whose values are
    NUL-padded already (numpy's ``S`` layout), of the given lengths."""
    return Cells(len(raw), int(lengths.sum()), plain=plain, empty=bool((lengths == 0).any()),
                 texts=(raw, raw.dtype.itemsize))


_BOOL = np.array([b"False", b"True"], dtype="S5")


def _bool_cells(values: np.ndarray) -> Cells:
    trues = int(np.count_nonzero(values))
    return Cells(len(values), 4 * trues + 5 * (len(values) - trues), plain=True, empty=False,
                 texts=lambda: (_BOOL[values.astype(np.intp)], 5))


def serialised(values: np.ndarray) -> bytes:
    """A flat array as orjson writes it: ``[v0,v1,...]``."""
    native = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    return orjson.dumps(native, option=orjson.OPT_SERIALIZE_NUMPY)


def text_spans(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Where each value's text starts and ends in a serialised array of at
    least one value (``serialised``): between the brackets and commas."""
    commas = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == _COMMA)
    return np.concatenate([[1], commas + 1]), np.concatenate([commas, [len(buf) - 1]])


def _patched(buf: bytes, patches: Sequence[tuple[np.ndarray, bytes]]) -> np.ndarray:
    """``buf`` (a serialised array) with the ``null`` of each patched row
    overwritten by its text, NUL-padded to the same four bytes
    (``layouts.views._csvjoin`` drops a text's trailing NULs)."""
    out = np.frombuffer(buf, dtype=np.uint8).copy()
    starts, _ = text_spans(buf)
    null = np.arange(len(b"null"))
    for where, text in patches:
        out[starts[where][:, None] + null] = np.frombuffer(text.ljust(len(b"null"), b"\0"),
                                                           dtype=np.uint8)
    return out


def _float_cells(values: np.ndarray) -> Cells:
    """Cells of floats as orjson writes them, its ``null`` for a non-finite
    value shown as ``nan``, ``inf`` or ``-inf``."""
    buf = serialised(values)
    rows = len(values)
    # Everything but the brackets and commas.
    total = len(buf) - 2 - (rows - 1)
    finite = np.isfinite(values)
    if finite.all():
        return Cells(rows, total, plain=True, empty=False, texts=(buf, 0))
    nan = np.isnan(values)
    negative = np.signbit(values)
    patches = [(where, text) for where, text in ((nan, b"nan"),
                                                 (~finite & ~nan & ~negative, b"inf"),
                                                 (~finite & ~nan & negative, b"-inf"))
               if where.any()]
    total += sum(int(np.count_nonzero(where)) * (len(text) - len(b"null"))
                 for where, text in patches)
    return Cells(rows, total, plain=True, empty=False,
                 texts=lambda: (_patched(buf, patches), 0))


def _number_cells(values: np.ndarray) -> Cells:
    buf = serialised(values)
    return Cells(len(values), len(buf) - 2 - (len(values) - 1), plain=True, empty=False,
                 texts=(buf, 0))


def _bytes_cells(values: np.ndarray) -> Cells | None:
    raw = np.ascontiguousarray(values)
    width = raw.dtype.itemsize
    scanned = scan(raw, len(raw), width) if width else None
    if scanned is None:
        return None  # not ASCII, or a NUL inside a value
    total, plain, empty = scanned
    return Cells(len(raw), total, plain=plain, empty=empty, texts=(raw, width))


def cells(values: np.ndarray) -> Cells | None:
    """The cells of a flat array of values, or None when its kind is not one
    this module makes (see the module docstring)."""
    if values.ndim != 1 or not len(values):
        return None
    kind = values.dtype.kind
    if kind == "b":
        return _bool_cells(values)
    if kind in "iu":
        return _number_cells(values)
    if kind == "f" and values.dtype.itemsize in {4, 8}:
        return _float_cells(values)
    if kind == "S":
        return _bytes_cells(values)
    return None


def cells_of_texts(texts: Sequence[str]) -> Cells | None:
    """Cells of texts made one by one (final: quoted already where needed),
    encoded as UTF-8 (unpaired surrogates replaced); None if one holds a NUL,
    which the padding could not tell from."""
    encoded = [text.encode("utf-8", "replace") for text in texts]
    if not encoded or any(b"\0" in item for item in encoded):
        return None
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    width = max(1, int(lengths.max()))
    return _fixed(np.array(encoded, dtype=f"S{width}"), lengths, plain=True)


def block_size(columns: Sequence[Cells]) -> int:
    """The bytes ``block_bytes`` gives for the same cells (one separator or line
    end after each field)."""
    return sum(c.total for c in columns) + len(columns) * columns[0].rows


def block_bytes(columns: Sequence[Cells], sep: bytes = b",", end: bytes = b"\n") -> bytes:
    """One line per row: the row's fields in column order, ``sep`` between
    them and ``end`` after the last (each one byte, not NUL). The lines are
    made in a buffer of ``block_size`` bytes, which they must fill exactly
    (else ValueError)."""
    return join([c.texts() for c in columns], columns[0].rows, block_size(columns), sep, end)


@dataclass(frozen=True, slots=True)
class RowPlan:
    """A blocked file made of ``head``, then one block per range of rows of
    ``ds``, each made by ``block(start, stop)`` from those rows alone: what
    lets the count of a block be kept with the chunks it came from."""

    ds: Dataset
    head: bytes
    ranges: Iterable[tuple[int, int]]
    block: Callable[[int, int], Awaitable[bytes | list[Cells]]]


def _count(block: bytes | list[Cells]) -> int:
    return len(block) if isinstance(block, bytes) else block_size(block)


class _Progress:
    """A count that says how far it got, at INFO, every ``PROGRESS_SECONDS``
    (a ``stat`` of a large table waits for it), and its total if it took long."""

    def __init__(self, ctx: ViewContext, kind: str) -> None:
        self._path = ctx.path
        self._kind = kind
        self.total = 0
        self._started = self._last = time.monotonic()

    def add(self, count: int) -> None:
        self.total += count
        now = time.monotonic()
        if now - self._last >= PROGRESS_SECONDS:
            self._last = now
            log.info("%s: counting the size of its %s view, %d bytes after %.0f s",
                     self._path, self._kind, self.total, now - self._started)

    def done(self) -> int:
        if self._last != self._started:
            log.info("%s: its %s view has %d bytes (counted in %.1f s)", self._path,
                     self._kind, self.total, time.monotonic() - self._started)
        return self.total


class BlockedFile(StreamedFile):
    """A streamed file made of blocks, each its bytes or its columns' cells:
    read, the cells' lines are made (fields joined by ``sep``); sized, they
    are only counted."""

    #: What separates the fields of a line.
    sep: bytes = b","
    #: What the file is, for the log (``CSV``, ``Matrix Market``...).
    kind: str = "CSV"

    @abstractmethod
    def blocks(self, ctx: ViewContext) -> AsyncIterator[bytes | list[Cells]]:
        """The file's blocks in order (an async generator)."""

    def row_plan(self, ctx: ViewContext) -> RowPlan | None:
        """The file as a ``RowPlan`` (the same blocks as ``blocks``), when it is
        one; None when its blocks come from more than one dataset."""
        return None

    async def pieces(self, ctx: ViewContext) -> AsyncIterator[bytes]:
        blocks = self.blocks(ctx)
        try:
            async for block in blocks:
                yield block if isinstance(block, bytes) else block_bytes(block, self.sep)
        finally:
            await close_stream(blocks)

    async def size(self, ctx: ViewContext) -> int:
        """The file's length, counted block by block without making the cells'
        lines (``_Progress`` logs a long count). A ``RowPlan``'s blocks are
        taken from ``ctx.block_counts`` where it keeps them, and the others
        are counted and given to it."""
        progress = _Progress(ctx, self.kind)
        counts = ctx.block_counts
        plan = None if counts is None else self.row_plan(ctx)
        if counts is None or plan is None:
            blocks = self.blocks(ctx)
            try:
                async for block in blocks:
                    progress.add(_count(block))
            finally:
                await close_stream(blocks)
            return progress.done()
        progress.add(len(plan.head))
        for start, stop in plan.ranges:
            count = await counts.get(plan.ds, start, stop)
            if count is None:
                count = _count(await plan.block(start, stop))
                counts.put(plan.ds, start, stop, count)
            progress.add(count)
        return progress.done()
