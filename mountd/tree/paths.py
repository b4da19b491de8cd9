"""Where things are: object paths, and where their entries are in the mount.

Owns ``ObjPath`` (how an object was reached: its domain, the link names from
the root, the ids on the way), the names of sidecars, and the location math
(``Places``) that turns an object or an HDF5 path into a path of the mount:
escaped names, with the domain's folders in front unless the mount is one
domain. Also the relative symlink text between two such paths, the text of
a link that leads nowhere in the mount (``inside_text``), and the
``InDomain`` mixin of the nodes of one domain's objects.

Pure computation: no I/O and no mutable state, safe from any task.
"""

from __future__ import annotations

import posixpath
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from layouts.model import AnyObject, Catalog, Domain
from mountd.errors import NotFound
from mountd.tree.names import display_name

ROOT_SIDECAR = ".root.json"
#: The HDF5 file view of a mount of one file (``mountd.tree.h5view``).
ROOT_H5 = ".root.h5"
SIDECAR = ".json"


@dataclass(frozen=True, slots=True)
class ObjPath:
    """Where an object was reached: its domain, link names from the root, ids on the way."""

    domain: Domain
    names: tuple[str, ...]
    ids: tuple[str, ...]
    #: ``(domain path, names)``: what is at this path, made once; the keys of
    #: the object's entries hold it (a walk keeps several per object).
    key: tuple[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.domain.path, self.names))

    @property
    def id(self) -> str:
        return self.ids[-1]

    @property
    def h5path(self) -> str:
        return "/" + "/".join(self.names)

    @property
    def parent(self) -> ObjPath:
        return ObjPath(self.domain, self.names[:-1], self.ids[:-1])

    def child(self, name: str, obj_id: str) -> ObjPath:
        return ObjPath(self.domain, (*self.names, name), (*self.ids, obj_id))

    def ancestor(self, obj_id: str) -> ObjPath | None:
        """The ancestor (or self) with id ``obj_id`` on this path, if any."""
        for depth in range(len(self.ids) - 1, -1, -1):
            if self.ids[depth] == obj_id:
                return ObjPath(self.domain, self.names[:depth], self.ids[:depth + 1])
        return None

    @property
    def parent_key(self) -> Hashable:
        """``parent.key``, without making the parent."""
        return (self.domain.path, self.names[:-1])


#: Fetches the object at a path (the tree's ``Tree.obj``).
FetchObject = Callable[[ObjPath], Awaitable[AnyObject]]


def root_path(domain: Domain) -> ObjPath:
    """Where a domain's root group is; NotFound for a folder."""
    if domain.root_id is None:
        raise NotFound(domain.path)
    return ObjPath(domain, (), (domain.root_id,))


def relative(target: tuple[str, ...], from_dir: tuple[str, ...]) -> str:
    """Symlink text in directory ``from_dir`` that leads to ``target``."""
    return posixpath.relpath("/" + "/".join(target), "/" + "/".join(from_dir))


def inside_text(raw: str) -> str:
    """Symlink text for a link that leads nowhere in the mount: ``raw`` made
    relative and unable to climb (no empty, ``.`` or ``..`` component; each
    component escaped as a name), so it resolves below the link's directory."""
    parts = [display_name(p) for p in raw.split("/") if p not in ("", ".")]
    return "/".join(parts) or display_name(raw)


class Places:
    """Where objects and their files are in the mount of ``catalog``."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def domain_prefix(self, domain: Domain) -> tuple[str, ...]:
        if self._catalog.single_domain is not None:
            return ()
        return tuple(p for p in domain.path.split("/") if p)

    def dir_location(self, op: ObjPath) -> tuple[str, ...]:
        return self.domain_prefix(op.domain) + tuple(display_name(n) for n in op.names)

    def file_location(self, op: ObjPath, suffix: str) -> tuple[str, ...]:
        """Where ``P<suffix>`` of the object at ``op`` is (``P.json``, ``P.npy``...)."""
        if op.names:
            return (*self.dir_location(op.parent), display_name(op.names[-1], suffix))
        prefix = self.domain_prefix(op.domain)
        if not prefix:
            return (ROOT_SIDECAR,) if suffix == SIDECAR else (f".root{suffix}",)
        return (*prefix[:-1], prefix[-1] + suffix)

    def h5_location(self, op: ObjPath, h5path: str) -> tuple[str, ...]:
        """Where the HDF5 path ``h5path``, read from the group at ``op``, would be
        in the mount, by its names alone: ``..`` above the domain's root stays
        at the root, as in HDF5, so the place is always inside the domain."""
        names = [] if h5path.startswith("/") else list(op.names)
        for comp in h5path.split("/"):
            if comp == "..":
                if names:
                    names.pop()
            elif comp not in ("", "."):
                names.append(comp)
        return self.domain_prefix(op.domain) + tuple(display_name(n) for n in names)


class InDomain:
    """Mixed into the nodes of one domain's objects: the domain's metadata
    (its ACLs) applies to them."""

    __slots__ = ()

    op: ObjPath

    async def domain_info(self) -> Mapping[str, Any] | None:
        return self.op.domain.info
