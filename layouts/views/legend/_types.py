"""The LEGEND ``datatype`` attribute grammar: parsing it into a type tree.

Owns ``parse_datatype``, which turns the text of a LEGEND object's
``datatype`` attribute into a ``LegendType``, its JSON form for the sidecar
(``type_json``), and the few questions the LEGEND views ask of a type.

The grammar (the LEGEND data format document, and what legend-pydataobj and
legend-lh5io write)::

    type    := NAME [ "<" INT { "," INT } ">" ] [ "{" body "}" ]
    scalar  := real | string | symbol | bool | complex | ...   (any bare NAME)
    array   := array<N>{type} | fixedsize_array<N>{type} | encoded_array<N>{type}
             | array_of_equalsized_arrays<N,M>{type}
             | array_of_encoded_equalsized_arrays<N,M>{type}
    fields  := struct{NAME,...} | table{NAME,...}     (names of child objects)
    enum    := enum{NAME=INT,...}

so a vector of vectors is ``array<1>{array<1>{real}}`` and a column of enum
values ``array<1>{enum{A=0,B=1}}``. Whitespace around tokens is ignored.

The text comes from a file and may be hostile: it is bounded in length
(``MAX_TEXT``), nesting (``MAX_DEPTH``), array rank and integer size, and
anything else is a ``DatatypeError`` naming the position, never another
exception or a deep recursion.

Pure functions over immutable values; safe from any task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: Longest datatype text parsed (a table of some thousands of columns).
MAX_TEXT = 1 << 16
#: Deepest nesting of ``{...}`` accepted.
MAX_DEPTH = 16
#: Largest array rank (``N`` and ``M`` of ``<N,M>``): HDF5's own limit.
MAX_RANK = 32
#: Enum values must fit a signed 64-bit integer.
INT64 = 1 << 63

#: Array kinds and how many ``<...>`` parameters each takes.
ARRAY_KINDS = {
    "array": 1,
    "fixedsize_array": 1,
    "encoded_array": 1,
    "array_of_equalsized_arrays": 2,
    "array_of_encoded_equalsized_arrays": 2,
}
FIELD_KINDS = frozenset({"struct", "table"})
#: Field names that cannot be HDF5 link names of the fields' objects.
_BAD_FIELD = re.compile(r"[/\x00]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[+-]?[0-9]{1,20}")  # bounded: int() of a huge text raises
_SPACE = re.compile(r"\s*")


class DatatypeError(ValueError):
    """A ``datatype`` text that is not in the grammar."""


@dataclass(frozen=True, slots=True)
class Scalar:
    """A scalar type: ``real``, ``string``, ``symbol``, ``bool``..."""

    name: str


@dataclass(frozen=True, slots=True)
class ArrayOf:
    """``kind<dims>{element}``: one of ``ARRAY_KINDS``."""

    kind: str
    dims: tuple[int, ...]
    element: LegendType


@dataclass(frozen=True, slots=True)
class Fields:
    """``struct{...}`` or ``table{...}``: the fields' names, in order."""

    kind: str
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Enum:
    """``enum{NAME=INT,...}``: the members in order."""

    members: tuple[tuple[str, int], ...]

    def names(self) -> dict[int, str]:
        """Each value's name (the first member with that value)."""
        out: dict[int, str] = {}
        for name, value in self.members:
            out.setdefault(value, name)
        return out


LegendType = Scalar | ArrayOf | Fields | Enum


class _Parser:
    """Recursive descent over one text; the depth is bounded by ``MAX_DEPTH``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> DatatypeError:
        return DatatypeError(f"{what} at offset {self.pos} of {self.text[:200]!r}")

    def skip(self) -> None:
        match = _SPACE.match(self.text, self.pos)
        self.pos = match.end() if match else self.pos

    def peek(self, char: str) -> bool:
        self.skip()
        return self.text.startswith(char, self.pos)

    def expect(self, char: str) -> None:
        if not self.peek(char):
            raise self.fail(f"expected {char!r}")
        self.pos += len(char)

    def token(self, pattern: re.Pattern[str], what: str) -> str:
        self.skip()
        match = pattern.match(self.text, self.pos)
        if match is None:
            raise self.fail(f"expected {what}")
        self.pos = match.end()
        return match.group()

    def until(self, stops: str) -> str:
        """The text up to the next of ``stops`` (or the end), stripped."""
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in stops:
            self.pos += 1
        return self.text[start:self.pos].strip()

    def type(self, depth: int) -> LegendType:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH}")
        name = self.token(_NAME, "a type name")
        params = self.params() if self.peek("<") else None
        if name in ARRAY_KINDS:
            if params is None or len(params) != ARRAY_KINDS[name]:
                raise self.fail(f"{name} needs {ARRAY_KINDS[name]} rank(s) in <...>")
            self.expect("{")
            element = self.type(depth + 1)
            self.expect("}")
            return ArrayOf(name, params, element)
        if params is not None:
            raise self.fail(f"{name} takes no <...>")
        if name in FIELD_KINDS:
            self.expect("{")
            return Fields(name, self.field_names())
        if name == "enum":
            self.expect("{")
            return Enum(self.members())
        if self.peek("{"):
            raise self.fail(f"unknown datatype {name!r}")
        return Scalar(name)

    def params(self) -> tuple[int, ...]:
        self.expect("<")
        out = [self.rank()]
        while self.peek(","):
            self.pos += 1
            out.append(self.rank())
            if len(out) > 2:
                raise self.fail("more than two ranks")
        self.expect(">")
        return tuple(out)

    def rank(self) -> int:
        text = self.token(_INT, "a rank")
        value = int(text)
        if not 0 <= value <= MAX_RANK:
            raise self.fail(f"rank {text} outside 0..{MAX_RANK}")
        return value

    def items(self) -> list[str]:
        """The comma-separated items of a ``{...}`` body, up to its ``}``."""
        out: list[str] = []
        if self.peek("}"):
            self.pos += 1
            return out
        while True:
            out.append(self.until(",{}<>"))
            if self.peek(","):
                self.pos += 1
                continue
            self.expect("}")
            return out

    def field_names(self) -> tuple[str, ...]:
        names = self.items()
        for name in names:
            if not name or name in (".", "..") or _BAD_FIELD.search(name):
                raise self.fail(f"bad field name {name!r}")
        if len(set(names)) != len(names):
            raise self.fail("a field name appears twice")
        return tuple(names)

    def members(self) -> tuple[tuple[str, int], ...]:
        out: list[tuple[str, int]] = []
        for item in self.items():
            name, eq, value = item.partition("=")
            name, value = name.strip(), value.strip()
            if not eq or not name or _INT.fullmatch(value) is None:
                raise self.fail(f"bad enum member {item!r} (want NAME=INT)")
            number = int(value)
            if not -INT64 <= number < INT64:
                raise self.fail(f"enum value {value} outside int64")
            out.append((name, number))
        if len({name for name, _ in out}) != len(out):
            raise self.fail("an enum name appears twice")
        return tuple(out)


def parse_datatype(text: str) -> LegendType:
    """The type a ``datatype`` attribute's text describes; ``DatatypeError`` if none."""
    if len(text) > MAX_TEXT:
        raise DatatypeError(f"datatype text of {len(text)} characters (at most {MAX_TEXT})")
    parser = _Parser(text)
    out = parser.type(0)
    parser.skip()
    if parser.pos != len(text):
        raise parser.fail("unexpected text")
    return out


def type_json(t: LegendType) -> dict[str, Any]:
    """The sidecar's JSON form of a type (the nesting is bounded by the parser)."""
    if isinstance(t, Scalar):
        return {"kind": t.name}
    if isinstance(t, ArrayOf):
        return {"kind": t.kind, "dims": list(t.dims), "element": type_json(t.element)}
    if isinstance(t, Fields):
        return {"kind": t.kind, "fields": list(t.names)}
    return {"kind": "enum", "members": dict(t.members)}


def is_vector_of_vectors(t: LegendType) -> bool:
    """``array<1>{array<1>{T}}``: rows of different lengths."""
    return (isinstance(t, ArrayOf) and t.kind == "array" and t.dims == (1,)
            and isinstance(t.element, ArrayOf) and t.element.kind == "array"
            and t.element.dims == (1,))


def innermost(t: LegendType) -> LegendType:
    """The element type under every array level."""
    while isinstance(t, ArrayOf):
        t = t.element
    return t
