"""Object references to paths: which HDF5 path an ``ObjectRef`` names.

Owns the per-domain index from object id to the first path that reaches it
(breadth first from the root, along hard links, at most ``REF_INDEX_LIMIT``
objects), built when a reference by id is first resolved and kept for
``ttl`` seconds. References that carry their path (LINDI) need no index.
Sidecars, xattrs and ``.zattrs`` resolve the references in attribute values
through ``resolver``.

Concurrency: an index is built whole and then swapped in with no ``await``
in between, so readers never see half of one; two tasks that miss at once
both build it and the second one's is kept.
"""

from __future__ import annotations

import collections
import time

from layouts.model import Domain, Group, LinkKind, ObjectKind, ObjectRef
from mountd.errors import MountError
from mountd.sidecar import RefResolver
from mountd.tree.paths import FetchObject, root_path

#: Most objects visited when indexing a domain to resolve references.
REF_INDEX_LIMIT = 200_000


class RefIndex:
    """The id-to-path indexes of the domains whose references were resolved."""

    def __init__(self, obj: FetchObject, ttl: float) -> None:
        self._obj = obj
        self._ttl = ttl
        self._index: dict[str, tuple[float, dict[str, str]]] = {}

    async def ref_path(self, domain: Domain, ref: ObjectRef) -> str | None:
        """The HDF5 path of a referenced object (first found breadth-first)."""
        if ref.path is not None:
            return ref.path
        if ref.obj_id is None:
            return None
        index = await self._domain_index(domain)
        return index.get(ref.obj_id)

    async def _domain_index(self, domain: Domain) -> dict[str, str]:
        now = time.monotonic()
        cached = self._index.get(domain.path)
        if cached is not None and cached[0] > now:
            return cached[1]
        root = root_path(domain)
        index: dict[str, str] = {root.id: "/"}
        queue = collections.deque([root])
        while queue and len(index) < REF_INDEX_LIMIT:
            op = queue.popleft()
            try:
                group = await self._obj(op)
            except MountError:
                continue
            if not isinstance(group, Group):
                continue
            for name, link in group.links.items():
                if link.kind is not LinkKind.HARD or link.target in index:
                    continue
                child = op.child(name, link.target)
                index[link.target] = child.h5path
                if link.target_kind in (None, ObjectKind.GROUP):
                    queue.append(child)
        self._index[domain.path] = (now + self._ttl, index)
        return index

    def resolver(self, domain: Domain) -> RefResolver:
        """Resolves the references of ``domain``'s objects to paths."""
        async def resolve(ref: ObjectRef) -> str | None:
            return await self.ref_path(domain, ref)
        return resolve
