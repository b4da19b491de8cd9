"""Blocks of table text at array speed: lengths for sizes, byte matrices for lines.

Owns ``Cells``, the texts of one column over a block of rows kept as arrays:
each value's length in bytes, and on demand a ``(rows, width)`` byte matrix
holding each text left-aligned and padded with NUL bytes. ``cells`` makes
them for the value kinds it can do without a Python object per value;
``cells_of_texts`` from texts made one by one. ``block_size`` counts the
bytes of a block of lines from the lengths alone, and ``block_bytes``
assembles the same lines from the matrices (each row's fields joined by
``sep`` and ended by ``end``, padding dropped), so a block's count and its
bytes come from the same cells.

Texts are those of ``layouts.views._columns`` (whose CSV, lines and tests
define them): integers as orjson writes them; ``float32`` and ``float64`` as
orjson's shortest round trip of their own width, NaN and infinities as
``nan``, ``inf`` and ``-inf``; bools as ``True``/``False``; fixed-length
byte strings as their bytes when every value is ASCII with no NUL inside.
``cells`` answers None for anything else (enum members, other float widths,
strings that are not ASCII, objects), and the caller makes the texts one by
one. ``Cells.plain`` tells whether no text needs CSV quoting.

Stateless functions; a ``Cells`` is built once and then only read (its
matrix is made at most once, by whichever caller asks first), so it may be
shared by the tasks of one stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import orjson
from numpy.lib.stride_tricks import sliding_window_view

#: Bytes that make a CSV field need quotes anywhere in it...
_SPECIAL = np.zeros(256, dtype=bool)
_SPECIAL[[ord(","), ord('"'), ord("\r"), ord("\n")]] = True
#: ...or at its start or end (what ``str.strip`` removes, among ASCII bytes).
_EDGE = np.zeros(256, dtype=bool)
_EDGE[[ord(c) for c in " \t\n\v\f\r\x1c\x1d\x1e\x1f"]] = True
_COMMA = ord(",")
_NONFINITE = {"nan": b"nan", "inf": b"inf", "-inf": b"-inf"}


class Cells:
    """The texts of one column over a block of rows (see the module docstring)."""

    __slots__ = ("_make", "_matrix", "lengths", "plain")

    def __init__(self, lengths: np.ndarray, plain: bool,
                 matrix: np.ndarray | None = None,
                 make: Callable[[], np.ndarray] | None = None) -> None:
        #: Each text's length in bytes (int64).
        self.lengths = lengths
        #: True when no text needs CSV quoting.
        self.plain = plain
        self._matrix = matrix
        self._make = make

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def matrix(self) -> np.ndarray:
        """The texts as a ``(rows, width)`` uint8 matrix, NUL-padded."""
        if self._matrix is None:
            assert self._make is not None
            self._matrix = self._make()
            self._make = None
        return self._matrix


def _fixed(raw: np.ndarray, lengths: np.ndarray, plain: bool) -> Cells:
    """Cells of a C-contiguous fixed-width bytes array whose values are
    NUL-padded already (numpy's ``S`` layout)."""
    width = raw.dtype.itemsize
    return Cells(lengths, plain, matrix=raw.view(np.uint8).reshape(len(raw), width))


_BOOL = np.array([b"False", b"True"], dtype="S5")
_BOOL_LEN = np.array([5, 4], dtype=np.int64)


def _bool_cells(values: np.ndarray) -> Cells:
    index = values.astype(np.intp)
    return _fixed(_BOOL[index], _BOOL_LEN[index], plain=True)


def _json_cells(values: np.ndarray) -> Cells:
    """Cells of numbers as orjson writes them, each found between the commas
    of one serialised array (``null`` for a non-finite float)."""
    native = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    raw = orjson.dumps(native, option=orjson.OPT_SERIALIZE_NUMPY)
    buf = np.frombuffer(raw, dtype=np.uint8)
    commas = np.flatnonzero(buf == _COMMA)
    starts = np.empty(len(values), dtype=np.int64)
    starts[0] = 1
    starts[1:] = commas + 1
    ends = np.empty(len(values), dtype=np.int64)
    ends[:-1] = commas
    ends[-1] = len(buf) - 1
    lengths = ends - starts

    def make() -> np.ndarray:
        width = int(lengths.max())
        # Each row is a window of the serialised array from the value's start,
        # cut at its length: the bytes after it (its comma, the next value) are zeroed.
        padded = np.concatenate([buf, np.zeros(width, dtype=np.uint8)])
        matrix = sliding_window_view(padded, width)[starts]
        matrix[np.arange(width) >= lengths[:, None]] = 0
        return matrix

    return Cells(lengths, plain=True, make=make)


def _float_cells(values: np.ndarray) -> Cells:
    cells = _json_cells(values)
    finite = np.isfinite(values)
    if finite.all():
        return cells
    make = cells._make
    assert make is not None
    signs = np.signbit(values)
    infinite = ~finite & ~np.isnan(values)
    patches = [(where, text) for where, text in ((np.isnan(values), _NONFINITE["nan"]),
                                                 (infinite & ~signs, _NONFINITE["inf"]),
                                                 (infinite & signs, _NONFINITE["-inf"]))
               if where.any()]
    for where, text in patches:
        cells.lengths[where] = len(text)

    def patched() -> np.ndarray:
        matrix = make()  # as wide as the longest text, patched ones included
        for where, text in patches:
            row = np.zeros(matrix.shape[1], dtype=np.uint8)
            row[:len(text)] = np.frombuffer(text, dtype=np.uint8)
            matrix[where] = row
        return matrix

    cells._make = patched
    return cells


def _bytes_cells(values: np.ndarray) -> Cells | None:
    raw = np.ascontiguousarray(values)
    width = raw.dtype.itemsize
    if not width:
        return None
    matrix = raw.view(np.uint8).reshape(len(raw), width)
    if len(raw) and int(matrix.max()) >= 0x80:
        return None
    lengths = np.char.str_len(raw).astype(np.int64)
    if int(np.count_nonzero(matrix)) != int(lengths.sum()):
        return None  # a NUL inside a value
    rows = np.arange(len(raw))
    nonempty = lengths > 0
    plain = not (_SPECIAL[matrix].any()
                 or _EDGE[matrix[nonempty, 0]].any()
                 or _EDGE[matrix[rows[nonempty], lengths[nonempty] - 1]].any())
    return Cells(lengths, plain, matrix=matrix)


def cells(values: np.ndarray) -> Cells | None:
    """The cells of a flat array of values, or None when its kind is not one
    this module makes (see the module docstring)."""
    if values.ndim != 1 or not len(values):
        return None
    kind = values.dtype.kind
    if kind == "b":
        return _bool_cells(values)
    if kind in "iu":
        return _json_cells(values)
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
    return sum(int(c.lengths.sum()) for c in columns) + len(columns) * columns[0].rows


def block_bytes(columns: Sequence[Cells], sep: bytes = b",", end: bytes = b"\n") -> bytes:
    """One line per row: the row's fields in column order, ``sep`` between
    them and ``end`` after the last (each one byte, not NUL)."""
    rows = columns[0].rows
    matrices = [c.matrix() for c in columns]
    width = sum(m.shape[1] for m in matrices) + len(matrices)
    lines = np.zeros((rows, width), dtype=np.uint8)
    at = 0
    for i, matrix in enumerate(matrices):
        lines[:, at:at + matrix.shape[1]] = matrix
        at += matrix.shape[1]
        lines[:, at] = (end if i == len(matrices) - 1 else sep)[0]
        at += 1
    flat = lines.reshape(-1)
    return flat[flat != 0].tobytes()
