"""Object references to paths: which HDF5 path an ``ObjectRef`` names.

Owns the per-domain index from object id to the first path that reaches it
(breadth first from the root, along hard links, at most ``REF_INDEX_LIMIT``
objects), built when a reference by id is first resolved and kept for the
rest of the ``epoch`` it was started in (``Tree.epoch``: a ``ttl``-long
period, which SIGHUP ends at once). References that carry their path (LINDI)
need no index. Sidecars, xattrs and ``.zattrs`` resolve the references in
attribute values through ``resolver``. At most ``MAX_DOMAINS`` indexes
holding at most ``MAX_KEPT_PATHS`` paths together are kept: when one more is
built, those of past epochs go, then the ones used longest ago.

Concurrency: an index is built whole and then swapped in with no ``await``
in between, so readers never see half of one; two tasks that miss at once
both build it and the second one's is kept. One whose build outlasts its
epoch answers the task that built it and is stale for every later one.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Hashable

from layouts.model import Domain, Group, LinkKind, ObjectKind, ObjectRef
from mountd.errors import MountError
from mountd.tree.paths import FetchObject, root_path
from mountd.tree.sidecar import RefResolver

#: Most objects visited when indexing a domain to resolve references.
REF_INDEX_LIMIT = 200_000
#: Most domain indexes kept.
MAX_DOMAINS = 64
#: Most paths kept in all indexes together (two full indexes).
MAX_KEPT_PATHS = 2 * REF_INDEX_LIMIT


class RefIndex:
    """The id-to-path indexes of the domains whose references were resolved."""

    def __init__(self, obj: FetchObject, epoch: Callable[[], Hashable]) -> None:
        self._obj = obj
        self._epoch = epoch
        #: (epoch, index) by domain path, the one used longest ago first.
        self._index: collections.OrderedDict[str, tuple[Hashable, dict[str, str]]] = (
            collections.OrderedDict())

    async def ref_path(self, domain: Domain, ref: ObjectRef) -> str | None:
        """The HDF5 path of a referenced object (first found breadth-first)."""
        if ref.path is not None:
            return ref.path
        if ref.obj_id is None:
            return None
        index = await self._domain_index(domain)
        return index.get(ref.obj_id)

    async def _domain_index(self, domain: Domain) -> dict[str, str]:
        epoch = self._epoch()
        cached = self._index.get(domain.path)
        if cached is not None and cached[0] == epoch:
            self._index.move_to_end(domain.path)
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
        # No await from here to the return.
        self._index.pop(domain.path, None)
        self._index[domain.path] = (epoch, index)
        self._trim()
        return index

    def _trim(self) -> None:
        """Drop the indexes of past epochs, then the ones used longest ago while there
        are more than ``MAX_DOMAINS`` or ``MAX_KEPT_PATHS`` paths."""
        epoch = self._epoch()
        for path, (made, _) in list(self._index.items()):
            if made != epoch:
                del self._index[path]
        total = sum(len(index) for _, index in self._index.values())
        while len(self._index) > 1 and (len(self._index) > MAX_DOMAINS
                                        or total > MAX_KEPT_PATHS):
            _, (_, gone) = self._index.popitem(last=False)
            total -= len(gone)

    def resolver(self, domain: Domain) -> RefResolver:
        """Resolves the references of ``domain``'s objects to paths (a partial, not a
        closure: one is made for every sidecar, ``.zattrs`` and xattr rendered)."""
        return functools.partial(self.ref_path, domain)
