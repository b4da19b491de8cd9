"""HSDS domain ACLs enforced per local user (``-o hsds_acls``, ``-o acl_map``).

Owns one decision: may the local user with a given uid read a domain or
folder, by the ``acls`` its ``.domain.json`` stores. The local user maps to
the HSDS user of the same name, or to the one ``acl_map`` names for it; that
user's ACL entry decides, else the ``default`` entry, else the answer is no
(as HSDS answers a user it has no entry for). A domain with no ``acls`` at
all is readable. ``fuse_ops`` asks this for every request that reveals or
reads what is inside a domain, with the caller's uid from the FUSE request.

The map file holds one ``LOCAL_USER HSDS_USER`` pair per line; ``#`` starts
a comment. Uids without a passwd entry map by their number (``"1234"``).
The HSDS user of each uid is remembered for the ``MAX_USERS`` uids seen
last (the passwd lookup may ask a directory service); one seen again after
that is looked up again.

Concurrency: synchronous lookups over immutable data and a bounded uid
cache, with no ``await``; safe from any trio task.
"""

from __future__ import annotations

import pwd
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mountd.errors import SourceError

DEFAULT_ENTRY = "default"
#: Uids whose HSDS user is remembered; the one asked for longest ago goes first.
MAX_USERS = 1024


def read_map(path: Path) -> dict[str, str]:
    """The ``acl_map`` file as {local user: HSDS user}; SourceError if unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read acl_map {path}: {exc}") from exc
    mapping: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise SourceError(f"{path}:{number}: expected LOCAL_USER HSDS_USER, got {line!r}")
        mapping[words[0]] = words[1]
    return mapping


class AclPolicy:
    """Read permission of local users on HSDS domains and folders."""

    def __init__(self, mapping: Mapping[str, str] | None = None) -> None:
        self._mapping = dict(mapping or {})
        self._users: OrderedDict[int, str] = OrderedDict()

    def hsds_user(self, uid: int) -> str:
        """The HSDS user name local ``uid`` acts as."""
        user = self._users.get(uid)
        if user is not None:
            self._users.move_to_end(uid)
            return user
        try:
            local = pwd.getpwuid(uid).pw_name
        except KeyError:
            local = str(uid)
        user = self._users[uid] = self._mapping.get(local, local)
        while len(self._users) > MAX_USERS:
            self._users.popitem(last=False)
        return user

    def may_read(self, info: Mapping[str, Any] | None, uid: int) -> bool:
        """Whether ``uid`` may read the domain or folder whose metadata is ``info``."""
        acls = None if info is None else info.get("acls")
        if not isinstance(acls, Mapping):
            return True
        entry = acls.get(self.hsds_user(uid), acls.get(DEFAULT_ENTRY))
        return isinstance(entry, Mapping) and entry.get("read") is True
