"""Link resolution: the object an HDF5 path or an external link names.

Owns following an HDF5 path from a group through its links: hard links (a
link back to an ancestor resolves to that ancestor's path, so a walk never
loops), soft links (at most ``MAX_SOFT_DEPTH`` deep, else the path counts
as a loop and does not resolve) and ``..`` (which stops at the domain's
root, as in HDF5); and finding the domain an external link points into,
when that domain is in this mount.

Concurrency: no state of its own; it reads objects through the function it
is given (the tree's cached catalog), from any number of tasks at once.
"""

from __future__ import annotations

import posixpath

from layouts.model import Catalog, Domain, Group, Link, LinkKind
from mountd.errors import MountError
from mountd.tree.paths import FetchObject, ObjPath, root_path

#: How many soft links one path may pass through before it counts as a loop.
MAX_SOFT_DEPTH = 16


class Links:
    """Resolves paths and external links among the objects of ``catalog``."""

    def __init__(self, catalog: Catalog, obj: FetchObject) -> None:
        self._catalog = catalog
        self._obj = obj

    async def resolve(self, start: ObjPath, h5path: str, depth: int = 0) -> ObjPath | None:
        """The object an HDF5 path names, following links; None if it does not resolve."""
        if depth > MAX_SOFT_DEPTH:
            return None
        cur = root_path(start.domain) if h5path.startswith("/") else start
        for comp in h5path.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                cur = cur.parent if cur.names else cur
                continue
            try:
                group = await self._obj(cur)
            except MountError:
                return None
            if not isinstance(group, Group):
                return None
            link = group.links.get(comp)
            if link is None:
                return None
            if link.kind is LinkKind.HARD:
                cur = cur.ancestor(link.target) or cur.child(comp, link.target)
            elif link.kind is LinkKind.SOFT:
                found = await self.resolve(cur, link.target, depth + 1)
                if found is None:
                    return None
                cur = found
            else:
                return None
        return cur

    async def external_domain(self, here: Domain, link: Link) -> Domain | None:
        """The domain an external link points into, if it is in this mount."""
        if self._catalog.single_domain is not None or not link.domain:
            return None
        name = link.domain
        if not name.startswith("/"):
            name = posixpath.join("/" + posixpath.dirname(here.path), name)
        path = posixpath.normpath(name).strip("/")
        try:
            domain = await self._catalog.domain(path)
        except MountError:
            return None
        if domain is None or domain.root_id is None:
            return None
        return domain
