"""What the mount should show for an HDF5 file, computed from h5py alone.

Walks an h5py file link by link and yields, for each path, what docs/CONTRACT.md
says must be in the mount: expected JSON values of attributes, expected chunk
contents padded with the fill value, the escaped mount path. The tests then
compare those with the files of a real mount.
"""

from __future__ import annotations

import base64
import math
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mountd.tree.names import display_name


@dataclass
class LinkInfo:
    path: str  # HDF5 path of the link, e.g. /g1/d
    link: Any  # h5py.HardLink / SoftLink / ExternalLink
    obj: Any  # the h5py object for hard links, else None
    cycle_to: str | None  # for a hard link to an ancestor: that ancestor's path


def mount_rel(h5path: str) -> str:
    """The mount-relative path of an HDF5 path (each component escaped)."""
    return "/".join(display_name(p) for p in h5path.split("/") if p)


def mount_file(h5path: str, suffix: str) -> str:
    """The mount-relative path of ``P<suffix>`` (``P.json``) for an HDF5 path."""
    parent, name = posixpath.split(h5path.rstrip("/"))
    return posixpath.join(mount_rel(parent), display_name(name, suffix)).lstrip("/")


def h5_normpath(h5path: str, from_group: str) -> str:
    """An HDF5 path read from ``from_group``, normalised by its names alone,
    ``..`` above the root staying at the root (docs/CONTRACT.md, "Links")."""
    names = [] if h5path.startswith("/") else [p for p in from_group.split("/") if p]
    for comp in h5path.split("/"):
        if comp == "..":
            if names:
                names.pop()
        elif comp not in ("", "."):
            names.append(comp)
    return "/" + "/".join(names)


def symlinks_leaving(mount: Path) -> tuple[int, list[str]]:
    """How many symlinks are under ``mount``, and those whose text is absolute
    or, resolved lexically from the link's directory, leaves ``mount`` at any
    step. ``os.walk`` does not follow symlinks."""
    seen, bad = 0, []
    for here, dirs, files in os.walk(mount):
        depth = len(Path(here).relative_to(mount).parts)
        for name in dirs + files:
            path = os.path.join(here, name)
            if not os.path.islink(path):
                continue
            seen += 1
            text = os.readlink(path)
            level = depth
            for comp in text.split("/"):
                level += -1 if comp == ".." else comp not in ("", ".")
                if level < 0:
                    break
            if text.startswith("/") or level < 0:
                bad.append(f"{path} -> {text}")
    return seen, bad


def walk_links(f: h5py.File) -> Iterator[LinkInfo]:
    """Every link in the file, depth first, not following soft/external links or cycles."""

    def visit(group: h5py.Group, path: str, ancestors: list[tuple[str, Any]]) -> Iterator[LinkInfo]:
        for name in group:
            link = group.get(name, getlink=True)
            child_path = posixpath.join(path, name)
            if not isinstance(link, h5py.HardLink):
                yield LinkInfo(child_path, link, None, None)
                continue
            obj = group[name]
            cycle = next((p for p, a in ancestors if a == obj), None)
            yield LinkInfo(child_path, link, obj, cycle)
            if cycle is None and isinstance(obj, h5py.Group):
                yield from visit(obj, child_path, [*ancestors, (child_path, obj)])

    yield from visit(f, "/", [("/", f["/"])])


def descr_fields(descr: list) -> list[tuple]:
    """A JSON ``descr`` (lists) as the tuples NumPy wants, nested fields included."""
    fields = []
    for name, kind, *shape in descr:
        base = descr_fields(kind) if isinstance(kind, list) else kind
        fields.append((name, base, tuple(shape[0])) if shape else (name, base))
    return fields


def json_float(x: float) -> Any:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def expected_json(value: Any, f: h5py.File) -> Any:
    """An HDF5 value as sidecars write it (docs/CONTRACT.md, "Sidecars")."""
    if isinstance(value, h5py.Empty):
        return None
    if isinstance(value, h5py.Reference):
        return {"$ref": f[value].name} if value else {"$ref": None}
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, np.void):
        if value.dtype.names:
            return [expected_json(value[n], f) for n in value.dtype.names]
        return {"base64": base64.b64encode(value.tobytes()).decode()}
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "V" and not value.dtype.names:
            return [expected_json(v, f) for v in value]
        return [expected_json(v, f) for v in value]
    if isinstance(value, np.generic):
        return expected_json(value.item(), f)
    raise TypeError(type(value))


def chunk_region(index: tuple[int, ...], chunks: list[int],
                 shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(i * c, min((i + 1) * c, n))
                 for i, c, n in zip(index, chunks, shape, strict=True))


def expected_chunk(ds: h5py.Dataset, index: tuple[int, ...], chunks: list[int],
                   dtype: np.dtype) -> np.ndarray:
    """The chunk at ``index`` as h5py reads it, padded with the fill value."""
    is_str = ds.dtype.kind == "O" and h5py.check_string_dtype(ds.dtype)
    if ds.shape == ():
        return np.asarray(ds.asstr()[()] if is_str else ds[()], dtype=dtype).reshape(1)
    region = chunk_region(index, chunks, ds.shape)
    if dtype.kind == "O":
        block = np.full(chunks, "", dtype=object)
    else:
        block = np.full(chunks, ds.fillvalue, dtype=dtype)
    part = ds.asstr()[region] if is_str else ds[region]
    block[tuple(slice(0, s) for s in np.shape(part))] = part
    return block
