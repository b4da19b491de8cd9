"""Reading a LINDI or kerchunk reference file into a ``RefTable``.

Owns the reference-file formats, not what the refs mean: the JSON file
(LINDI ``.lindi.json``, kerchunk version 0 and 1), the ``.lindi.tar``
container (its ``.tar_entry.json`` -> ``.tar_index.json`` -> ``lindi.json``
chain) and the ``.lindi.d`` directory (``lindi.json`` plus ``blobs/``). The
result maps each zarr v2 key to inline bytes or a ``RangeRef`` whose URL is
already resolved: ``{{name}}`` templates substituted, ``file://`` stripped,
relative paths made absolute (or joined to the reference URL), and members
of a ``.lindi.tar`` turned into byte ranges of the tar itself.

What the writers do, and so what is read here (lindi 0.4.6
``LindiReferenceFileSystemStore``, ``tar/lindi_tar.py``,
``tar/LindiTarStore.py``; kerchunk's reference spec):

* A ref is a string (``base64:`` + binary, else UTF-8 text), an object
  (JSON text), ``[url]`` (the whole file) or ``[url, offset, length]``.
* lindi writes the blobs of a tar or directory as ``["./blobs/KEY", 0, size]``;
  in a tar, the name after ``./`` is a member listed in ``.tar_index.json``.
* lindi pads ``lindi.json`` in a tar with spaces so it can be rewritten in
  place; a rewrite that does not fit renames the old member into ``.trash/``
  and appends a new one, so members are found by the index, never by scanning.
* kerchunk ``gen`` is expanded when its ``{{...}}`` parts are names or integer
  arithmetic (``+ - * // %``, parentheses); any other jinja is refused.

The reference JSON itself is refused (``RefFormatError``) when it is larger
than ``MAX_JSON_BYTES`` (1 GiB), known from its size before it is read, when
it is not UTF-8 JSON or nests deeper than the parser's recursion limit, and
when its own structure (``templates``, ``gen``, ``version``...) is wrong. One
malformed ref (a number, a bad offset or length, an unknown template, an
inline string that is not valid Unicode) becomes a ``BadRef``: reading it
fails, for the object it belongs to alone (docs/CONTRACT.md, "Errors"). Other
hostile values are left for the object that uses them to refuse
(``layouts.formats.refs._catalog``).

Security is not checked here: a remote reference file may name local paths,
and ``RangeRef.url`` keeps them as local paths for the reader to refuse. URLs
of a scheme other than http(s) and file (``s3://...``) are kept as written,
for the reader to refuse or handle.

Concurrency: ``parse_refs`` is a pure function; ``load_reference`` awaits the
store reads and parses the JSON in one worker thread, so a big reference file
does not stall the trio loop. A ``RefTable`` is immutable once built and may
be shared by any number of tasks.
"""

from __future__ import annotations

import ast
import base64
import itertools
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import trio

from layouts.errors import NotFound
from layouts.storage import ByteRange, OpenUri, Store

log = logging.getLogger(__name__)

KIND_LINDI = "lindi"
KIND_KERCHUNK = "kerchunk"
KIND_TAR = "lindi.tar"
KIND_DIR = "lindi.d"
KINDS = (KIND_LINDI, KIND_KERCHUNK, KIND_TAR, KIND_DIR)

#: Largest JSON reference text accepted (a ``.lindi.json``, or ``lindi.json`` of a
#: tar or a ``.lindi.d``). Larger files are refused before they are read; this is
#: the reference file's own cap, apart from ``-o max_metadata``, as one file holds
#: the metadata of a whole HDF5 file (a million chunks take about 100 MB).
MAX_JSON_BYTES = 1 << 30
#: Largest ``.tar_entry.json`` or ``.tar_index.json`` accepted.
MAX_TAR_INDEX_BYTES = 256 << 20
#: Most refs that one kerchunk ``gen`` list may expand to.
MAX_GEN_REFS = 10_000_000
#: Bytes read first from a reference file: the tar header of ``.tar_entry.json``
#: and the 1024 bytes lindi gives that member (or the start of a JSON file).
PROBE_BYTES = 512 + 1024
#: Name of the reference JSON inside a ``.lindi.tar`` or ``.lindi.d``.
LINDI_JSON = "lindi.json"

_TAR_ENTRY = ".tar_entry.json"
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_BOM = b"\xef\xbb\xbf"
_PADDING = b" \t\r\n\x00"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_NON_BLANK = re.compile(rb"[^ \t\r\n]")
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_INT_OPS: dict[type[ast.operator], Any] = {
    ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__,
    ast.FloorDiv: int.__floordiv__, ast.Mod: int.__mod__,
}


class RefFormatError(ValueError):
    """A file is not a LINDI or kerchunk reference file, or breaks that format."""


#: Makes the error to raise from a message (adding the reference file's location).
Fail = Callable[[str], RefFormatError]


@dataclass(frozen=True, slots=True)
class RangeRef:
    """``length`` bytes at ``offset`` of ``url`` (``length=None``: to the end).

    ``url`` is ``http://...``/``https://...``, an absolute local path, or a
    URL of another scheme (``s3://...``) kept as written.
    """

    url: str
    offset: int
    length: int | None


@dataclass(frozen=True, slots=True)
class BadRef:
    """A ref the file gets wrong (a number, a bad offset, an unknown template...):
    reading it fails with ``problem``, and only it; the rest of the file is used."""

    problem: str


Ref = bytes | RangeRef | BadRef


@dataclass(frozen=True)
class RefTable:
    """The refs of one reference file, with their URLs resolved."""

    refs: Mapping[str, Ref]
    location: str
    remote: bool
    kind: str
    metadata: Mapping[str, Any]
    size: int
    mtime: float | None

    def resolve(self, url: str) -> str:
        """``url`` (say of an ``_EXTERNAL_ARRAY_LINK``) resolved as ref URLs are,
        without templates. A relative URL in a ``.lindi.tar`` names a file next
        to the tar: a member of the tar is not a location of its own."""
        return _Resolver(self.location, self.remote, self.kind).resolve(url, repr(url))


class _Resolver:
    """Resolves the URLs of one reference file (relative ones against its location)."""

    __slots__ = ("base", "location", "remote")

    def __init__(self, location: str, remote: bool, kind: str) -> None:
        self.location = location
        self.remote = remote
        if remote:
            self.base = _dir_url(location) if kind == KIND_DIR else location
        else:
            self.base = location if kind == KIND_DIR else os.path.dirname(location)

    def fail(self, message: str) -> RefFormatError:
        return RefFormatError(f"{self.location}: {message}")

    def relative(self, url: str) -> bool:
        """True if ``url`` is a relative path (no scheme, not absolute)."""
        return not url.startswith("/") and _SCHEME.match(url) is None

    def resolve(self, url: str, where: str) -> str:
        """``url`` as an http(s) URL, an absolute local path, or another scheme's URL."""
        if not url:
            raise self.fail(f"{where}: empty URL")
        scheme = _SCHEME.match(url)
        if scheme is not None:
            name = scheme.group().lower()
            if name in ("http://", "https://"):
                return name + url[len(name):]
            if name != "file://":
                return url
            url = url[len(name):]
            if url.startswith("localhost/"):
                url = url[len("localhost"):]
            if not url:
                raise self.fail(f"{where}: file:// URL without a path")
        if url.startswith("/"):
            return os.path.normpath(url)
        if self.remote:
            return urljoin(self.base, url)
        return os.path.normpath(os.path.join(self.base, url))


def _dir_url(url: str) -> str:
    """``url`` of a directory, ending in the ``/`` that makes urljoin resolve inside it."""
    parts = urlsplit(url)
    if parts.path.endswith("/"):
        return url
    return urlunsplit(parts._replace(path=parts.path + "/"))


def _is_http(location: str) -> bool:
    return location[:8].lower().startswith(("http://", "https://"))


def _normal_location(location: str, remote: bool) -> str:
    """An absolute local path, or the URL with its scheme in lower case."""
    if not remote:
        return os.path.normpath(os.path.abspath(location))
    scheme, rest = location.split(":", 1)
    return f"{scheme.lower()}:{rest}"


# ---------------------------------------------------------------- templates

def _render(text: str, variables: Mapping[str, Any], fail: Fail, where: str) -> str:
    """``text`` with each ``{{expr}}`` replaced by its value under ``variables``."""
    if "{{" not in text:
        return text
    out = _TEMPLATE.sub(lambda m: str(_evaluate(m.group(1).strip(), variables, fail, where)),
                        text)
    if "{{" in out:
        raise fail(f"{where}: unsupported template syntax in {text!r} "
                   "(only {{name}} and integer arithmetic are supported)")
    return out


def _evaluate(expr: str, variables: Mapping[str, Any], fail: Fail, where: str) -> Any:
    """A template name, or integer arithmetic over names and literals."""
    if expr in variables:
        return variables[expr]
    if expr.isidentifier():
        raise fail(f"{where}: unknown template {expr!r}")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise fail(f"{where}: unsupported jinja expression {{{{{expr}}}}}") from None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in variables:
                raise fail(f"{where}: unknown template {node.id!r}")
            return variables[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = integer(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _INT_OPS:
            left, right = integer(node.left), integer(node.right)
            if right == 0 and isinstance(node.op, ast.FloorDiv | ast.Mod):
                raise fail(f"{where}: division by zero in {{{{{expr}}}}}")
            result = _INT_OPS[type(node.op)](left, right)
            if abs(result) >= 1 << 63:
                raise fail(f"{where}: {{{{{expr}}}}} is out of range")
            return result
        raise fail(f"{where}: unsupported jinja expression {{{{{expr}}}}}")

    def integer(node: ast.AST) -> int:
        result = value(node)
        if type(result) is not int:
            raise fail(f"{where}: {{{{{expr}}}}} does arithmetic on a string")
        return result

    try:
        return value(tree.body)
    except RecursionError:
        raise fail(f"{where}: {{{{{expr}}}}} is nested too deeply") from None


# ---------------------------------------------------------------- parsing

class _Parser:
    """Turns the decoded JSON of one reference file into refs, in place."""

    def __init__(self, resolver: _Resolver, templates: Mapping[str, str],
                 members: Mapping[str, tuple[int, int]] | None) -> None:
        self.resolver = resolver
        self.fail = resolver.fail
        self.templates = templates
        self.members = members
        #: raw URL -> (resolved URL, member data offset, member size); the last
        #: two are None unless the URL names a member of the tar.
        self.targets: dict[str, tuple[str, int | None, int | None]] = {}
        #: each resolved URL once, so the refs naming it share one string
        self.urls: dict[str, str] = {}
        #: each length once (chunks mostly share a few), to save an int per ref
        self.lengths: dict[int, int] = {}

    def convert(self, refs: dict[str, Any]) -> int:
        """Replace each JSON value of ``refs`` by its ``Ref`` (values only, so in place);
        a malformed value becomes a ``BadRef``. The number of those."""
        b64decode = base64.b64decode
        bad = 0
        for key, value in refs.items():
            kind = type(value)
            try:
                if kind is list:
                    refs[key] = self.range_ref(key, value)
                elif kind is str:
                    try:
                        refs[key] = (b64decode(value[7:]) if value.startswith("base64:")
                                     else value.encode())
                    except ValueError as exc:  # binascii.Error, UnicodeEncodeError
                        raise self.fail(f"refs[{key!r}]: bad string value: {exc}") from None
                elif kind is dict:
                    try:
                        refs[key] = json.dumps(value).encode()
                    except RecursionError:
                        raise self.fail(f"refs[{key!r}]: JSON nested too deeply") from None
                else:
                    raise self.fail(f"refs[{key!r}]: a ref must be a string, object or list, "
                                    f"not {_json_type(value)}")
            except RefFormatError as exc:
                if not bad:
                    log.warning("%s (reading it gives EIO; other bad refs are logged when "
                                "read)", exc)
                refs[key] = BadRef(str(exc))
                bad += 1
        return bad

    def range_ref(self, key: str, value: list[Any]) -> RangeRef:
        if len(value) == 3:
            url, offset, length = value
            if type(offset) is not int or offset < 0:
                raise self.fail(f"refs[{key!r}]: offset must be a non-negative integer, "
                                f"not {offset!r}")
            if type(length) is not int or length < 0:
                raise self.fail(f"refs[{key!r}]: length must be a non-negative integer, "
                                f"not {length!r}")
        elif len(value) == 1:
            url, offset, length = value[0], 0, None
        else:
            raise self.fail(f"refs[{key!r}]: a list ref must be [url] or [url, offset, length],"
                            f" not {len(value)} items")
        if type(url) is not str:
            raise self.fail(f"refs[{key!r}]: the URL must be a string, not {_json_type(url)}")
        return self.range_of(key, url, offset, length)

    def range_of(self, key: str, url: str, offset: int, length: int | None) -> RangeRef:
        target = self.targets.get(url)
        if target is None:
            target = self.targets[url] = self.target(key, url)
        resolved, start, size = target
        if start is None or size is None:
            if length is not None:
                length = self.lengths.setdefault(length, length)
            return RangeRef(resolved, offset, length)
        if length is None:
            return RangeRef(resolved, start, size)
        if offset + length > size:
            raise self.fail(f"refs[{key!r}]: bytes {offset}..{offset + length} are past the "
                            f"end of tar member {url!r} ({size} bytes)")
        return RangeRef(resolved, start + offset, length)

    def target(self, key: str, url: str) -> tuple[str, int | None, int | None]:
        where = f"refs[{key!r}]"
        url = _render(url, self.templates, self.fail, where)
        if self.members is not None and self.resolver.relative(url):
            member = self.members.get(url[2:] if url.startswith("./") else url)
            if member is not None:
                return self.resolver.location, member[0], member[1]
        resolved = self.resolver.resolve(url, where)
        return self.urls.setdefault(resolved, resolved), None, None

    def gen(self, gen: Any) -> Iterator[tuple[str, RangeRef]]:
        """The refs of a kerchunk v1 ``gen`` list."""
        if type(gen) is not list:
            raise self.fail(f"gen: must be a list, not {_json_type(gen)}")
        for i, item in enumerate(gen):
            where = f"gen[{i}]"
            if type(item) is not dict:
                raise self.fail(f"{where}: must be an object, not {_json_type(item)}")
            key, url = item.get("key"), item.get("url")
            offset, length = item.get("offset"), item.get("length")
            for name, text in (("key", key), ("url", url)):
                if type(text) is not str:
                    raise self.fail(f"{where}.{name}: must be a string, not {_json_type(text)}")
            if (offset is None) != (length is None):
                raise self.fail(f"{where}: offset and length must be given together")
            for name, text in (("offset", offset), ("length", length)):
                if text is not None and type(text) not in (str, int):
                    raise self.fail(f"{where}.{name}: must be a string, not {_json_type(text)}")
            names, ranges = self.dimensions(item.get("dimensions"), where)
            for values in itertools.product(*ranges):
                variables = {**self.templates, **dict(zip(names, values, strict=True))}
                gen_key = _render(key, variables, self.fail, f"{where}.key")
                gen_url = _render(url, variables, self.fail, f"{where}.url")
                if offset is None or length is None:
                    yield gen_key, self.range_of(gen_key, gen_url, 0, None)
                else:
                    yield gen_key, self.range_of(
                        gen_key, gen_url, self.gen_int(offset, variables, f"{where}.offset"),
                        self.gen_int(length, variables, f"{where}.length"))

    def dimensions(self, dims: Any, where: str) -> tuple[list[str], list[range | list[int]]]:
        if type(dims) is not dict or not dims:
            raise self.fail(f"{where}.dimensions: must be a non-empty object")
        names: list[str] = []
        ranges: list[range | list[int]] = []
        for name, dim in dims.items():
            here = f"{where}.dimensions[{name!r}]"
            if type(dim) is list:
                if not all(type(v) is int for v in dim):
                    raise self.fail(f"{here}: a list must hold integers")
                ranges.append(dim)
            elif type(dim) is dict:
                bounds = {k: dim.get(k, default) for k, default in
                          (("start", 0), ("stop", None), ("step", 1))}
                if not all(type(v) is int for v in bounds.values()) or bounds["step"] == 0:
                    raise self.fail(f"{here}: needs integer stop, start and non-zero step")
                ranges.append(range(bounds["start"], bounds["stop"], bounds["step"]))
            else:
                raise self.fail(f"{here}: must be an object or a list, not {_json_type(dim)}")
            names.append(name)
        count = math.prod(len(r) for r in ranges)
        if count > MAX_GEN_REFS:
            raise self.fail(f"{where}: expands to {count} refs, more than {MAX_GEN_REFS}")
        return names, ranges

    def gen_int(self, text: str | int, variables: Mapping[str, Any], where: str) -> int:
        rendered = text if type(text) is int else _render(str(text), variables, self.fail, where)
        try:
            number = int(rendered)
        except ValueError:
            raise self.fail(f"{where}: {rendered!r} is not an integer") from None
        if number < 0:
            raise self.fail(f"{where}: {number} is negative")
        return number


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _not_reference(location: str, raw: bytes) -> RefFormatError:
    if raw.startswith(_HDF5_SIGNATURE):
        why = "it is an HDF5 file"
    elif not raw.strip(_PADDING):
        why = "it is empty"
    else:
        why = f"it starts with {raw[:16]!r}"
    return RefFormatError(f"not a LINDI or kerchunk reference file: {location} ({why})")


def _looks_like_json(raw: bytes) -> bool | None:
    """True if the first non-blank byte is ``{``; None if ``raw`` is all blank."""
    found = _NON_BLANK.search(raw, len(_BOM) if raw.startswith(_BOM) else 0)
    return None if found is None else found.group() == b"{"


def _decode(raw: bytes, fail: Fail, what: str) -> dict[str, Any]:
    """The JSON object in ``raw`` (trailing spaces and NULs, as lindi pads, allowed)."""
    try:
        obj = json.loads(raw.rstrip(_PADDING))
    except (ValueError, RecursionError) as exc:
        raise fail(f"{what}: invalid JSON: {exc}") from None
    if type(obj) is not dict:
        raise fail(f"{what}: must be a JSON object, not {_json_type(obj)}")
    return obj


def parse_refs(raw: bytes, location: str, remote: bool, *, kind_hint: str | None = None,
               members: Mapping[str, tuple[int, int]] | None = None,
               size: int | None = None, mtime: float | None = None) -> RefTable:
    """The ``RefTable`` of the reference JSON ``raw`` read from ``location``.

    ``kind_hint``: ``"lindi.tar"`` (``raw`` is the tar's ``lindi.json``, and
    ``members`` maps each member name to its (data offset, size)), ``"lindi.d"``
    (``location`` is the directory), ``"lindi"`` or ``"kerchunk"``; None picks
    ``"kerchunk"`` for version 0 or a ``gen`` list, ``"lindi"`` for a file with
    ``generationMetadata`` or named ``*.lindi.json``, else ``"kerchunk"``.
    ``size`` defaults to ``len(raw)``.
    """
    if kind_hint is not None and kind_hint not in KINDS:
        raise ValueError(f"unknown reference kind {kind_hint!r}")
    if (kind_hint == KIND_TAR) != (members is not None):
        raise ValueError("members are given exactly for a .lindi.tar")
    location = _normal_location(location, remote)
    if remote and kind_hint == KIND_DIR:
        location = location.rstrip("/")
    if not _looks_like_json(raw):
        raise _not_reference(location, raw)
    resolver = _Resolver(location, remote, kind_hint or KIND_LINDI)
    fail = resolver.fail
    obj = _decode(raw, fail, "reference file")

    version = obj.get("version")
    v0 = "refs" not in obj and version is None
    if not v0:
        if version is not None and (type(version) is not int or version != 1):
            raise fail(f"version: must be 1, not {version!r}")
        refs = obj.get("refs", {})
        if type(refs) is not dict:
            raise fail(f"refs: must be an object, not {_json_type(refs)}")
        templates = obj.get("templates", {})
        if type(templates) is not dict:
            raise fail(f"templates: must be an object, not {_json_type(templates)}")
        for name, value in templates.items():
            if type(value) is not str:
                raise fail(f"templates[{name!r}]: must be a string, not {_json_type(value)}")
        metadata = obj.get("generationMetadata", {})
        if type(metadata) is not dict:
            raise fail(f"generationMetadata: must be an object, not {_json_type(metadata)}")
        gen = obj.get("gen")
    else:
        refs, templates, metadata, gen = obj, {}, {}, None
    del obj

    parser = _Parser(resolver, templates, members)
    bad = parser.convert(refs)
    if gen is not None:
        refs.update(parser.gen(gen))
    kind = kind_hint or _json_kind(location, v0 or gen is not None, bool(metadata))
    log.debug("%s: %d refs (%s, %d malformed), %d distinct URLs", location, len(refs), kind,
              bad, len(parser.targets))
    return RefTable(refs=refs, location=location, remote=remote, kind=kind, metadata=metadata,
                    size=len(raw) if size is None else size, mtime=mtime)


def _json_kind(location: str, kerchunk_only: bool, lindi_metadata: bool) -> str:
    if kerchunk_only:
        return KIND_KERCHUNK
    name = urlsplit(location).path if _is_http(location) else location
    if lindi_metadata or name.endswith(".lindi.json"):
        return KIND_LINDI
    return KIND_KERCHUNK


# ---------------------------------------------------------------- loading

async def load_reference(location: str, open_uri: OpenUri, *, is_dir: bool) -> RefTable:
    """The ``RefTable`` of the reference file (or ``.lindi.d`` directory) at ``location``.

    ``location`` is an absolute local path or an http(s) URL; ``open_uri``
    maps it (or a file inside a directory) to the store and key to read. The
    kind is taken from the content: a directory holds ``lindi.json``; ``ustar``
    at byte 257 is a ``.lindi.tar``, of which only the index chain and
    ``lindi.json`` are read; anything else must be JSON. Raises
    ``RefFormatError`` for a file of another format, and the store's errors
    (``NotFound``, ``StorageError``) when it cannot be read.
    """
    remote = _is_http(location)
    location = _normal_location(location, remote)
    if is_dir or (remote and urlsplit(location).path.endswith(("/", ".lindi.d"))):
        return await _load_dir(location, remote, open_uri)
    store, key = open_uri(location)
    first = await store.fetch(key, ByteRange(0, PROBE_BYTES))
    info = first.info
    json_like = _looks_like_json(first.data)
    if not json_like and first.data[257:262] == b"ustar":
        return await _TarReader(location, remote, store, key, info.etag).load(
            first.data, info.size, info.mtime)
    if json_like is False:
        raise _not_reference(location, first.data)
    _check_json_size(location, info.size)
    data = first.data
    if info.size > len(data):
        data = (await store.fetch(key, None, if_match=info.etag or None)).data
    return await _parse_in_thread(data, location, remote, kind=None, size=info.size,
                                  mtime=info.mtime)


async def _load_dir(location: str, remote: bool, open_uri: OpenUri) -> RefTable:
    if remote:
        json_location = urljoin(_dir_url(location), LINDI_JSON)
        location = _dir_url(location).rstrip("/")
    else:
        json_location = os.path.join(location, LINDI_JSON)
    store, key = open_uri(json_location)
    try:
        first = await store.fetch(key, ByteRange(0, PROBE_BYTES))
    except NotFound:
        raise RefFormatError(f"not a LINDI reference directory: {location} "
                             f"has no {LINDI_JSON}") from None
    info = first.info
    _check_json_size(json_location, info.size)
    data = first.data
    if info.size > len(data):
        data = (await store.fetch(key, None, if_match=info.etag or None)).data
    return await _parse_in_thread(data, location, remote, kind=KIND_DIR,
                                  size=info.size, mtime=info.mtime)


async def _parse_in_thread(raw: bytes, location: str, remote: bool, *, kind: str | None,
                           members: Mapping[str, tuple[int, int]] | None = None, size: int,
                           mtime: float | None) -> RefTable:
    # a store that does not know the modification time says 0
    return await trio.to_thread.run_sync(partial(
        parse_refs, raw, location, remote, kind_hint=kind, members=members, size=size,
        mtime=mtime or None))


def _check_json_size(location: str, size: int) -> None:
    if size > MAX_JSON_BYTES:
        raise RefFormatError(f"{location}: the reference JSON is {size} bytes, "
                             f"more than the {MAX_JSON_BYTES} accepted")


class _TarReader:
    """Reads the index chain and ``lindi.json`` of one ``.lindi.tar``."""

    def __init__(self, location: str, remote: bool, store: Store, key: str, etag: str) -> None:
        self.location = location
        self.remote = remote
        self.store = store
        self.key = key
        self.etag = etag or None

    def fail(self, message: str) -> RefFormatError:
        return RefFormatError(f"{self.location}: {message}")

    async def read(self, offset: int, size: int, what: str) -> bytes:
        """``size`` bytes at ``offset``, from the version of the tar first read."""
        data = (await self.store.fetch(self.key, ByteRange(offset, size),
                                       if_match=self.etag)).data
        if len(data) != size:
            raise self.fail(f"{what}: the tar ends after {offset + len(data)} bytes, "
                            f"before the member's end at {offset + size}")
        return data

    async def load(self, first: bytes, tar_size: int, mtime: float) -> RefTable:
        header = first[:512]
        name = header[:100].split(b"\0", 1)[0]
        if name != _TAR_ENTRY.encode():
            raise self.fail(f"a tar file but not a .lindi.tar: its first member is "
                            f"{name.decode(errors='replace')!r}, not {_TAR_ENTRY}")
        entry_size = self.octal(header[124:136])
        self.check_size(entry_size, _TAR_ENTRY)
        end = 512 + entry_size
        entry_raw = first[512:end] if end <= len(first) else await self.read(
            512, entry_size, _TAR_ENTRY)
        entry = _decode(entry_raw, self.fail, _TAR_ENTRY)
        index_name, index_start, index_size = self.member(entry.get("index"),
                                                          f"{_TAR_ENTRY}: index", tar_size)
        self.check_size(index_size, index_name)
        index = _decode(await self.read(index_start, index_size, index_name), self.fail,
                        index_name)
        files = index.get("files")
        if type(files) is not list:
            raise self.fail(f"{index_name}: files must be a list, not {_json_type(files)}")
        members: dict[str, tuple[int, int]] = {}
        for i, item in enumerate(files):
            member_name, start, size = self.member(item, f"{index_name}: files[{i}]", tar_size)
            members[member_name] = (start, size)
        found = members.get(LINDI_JSON)
        if found is None:
            raise self.fail(f"the tar index lists no {LINDI_JSON}")
        _check_json_size(f"{self.location}: {LINDI_JSON}", found[1])
        raw = await self.read(found[0], found[1], LINDI_JSON)
        log.debug("%s: .lindi.tar of %d members, %s at %d (%d bytes)", self.location,
                  len(members), LINDI_JSON, found[0], found[1])
        return await _parse_in_thread(raw, self.location, self.remote, kind=KIND_TAR,
                                      members=members, size=tar_size, mtime=mtime)

    def member(self, item: Any, where: str, tar_size: int) -> tuple[str, int, int]:
        """(name, data offset, size) of an index item ``{n, o, d, s}``."""
        if type(item) is not dict:
            raise self.fail(f"{where}: must be an object, not {_json_type(item)}")
        name = item.get("n")
        if type(name) is not str:
            raise self.fail(f"{where}: n must be a string, not {_json_type(name)}")
        start, size = item.get("d"), item.get("s")
        for field, value in (("d", start), ("s", size)):
            if type(value) is not int or value < 0:
                raise self.fail(f"{where} ({name!r}): {field} must be a non-negative "
                                f"integer, not {value!r}")
        if start + size > tar_size:
            raise self.fail(f"{where} ({name!r}): bytes {start}..{start + size} are past the "
                            f"end of the tar ({tar_size} bytes)")
        return name, start, size

    def octal(self, field: bytes) -> int:
        """A tar header number: octal digits, or GNU base-256 when the high bit is set."""
        if field and field[0] & 0x80:
            return int.from_bytes(field[1:], "big")
        try:
            return int(field.strip(b" \0") or b"0", 8)
        except ValueError:
            raise self.fail(f"{_TAR_ENTRY}: bad size {field!r} in the tar header") from None

    def check_size(self, size: int, what: str) -> None:
        if size > MAX_TAR_INDEX_BYTES:
            raise self.fail(f"{what}: {size} bytes, more than the {MAX_TAR_INDEX_BYTES} "
                            "accepted for a tar index")
