"""A one-dataset HSDS domain written key by key, with no server, for mount tests.

Owns ``write_one_dataset``: the domain's ``.domain.json``, its root group
linking one chunked dataset, and that dataset's JSON, in HSDS schema v2
(the object keys derived from the ids, as HSDS derives them). The caller
writes the chunks into the directory it returns. Plain synchronous file
writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_one_dataset(bucket: Path, domain: str, root_id: str, dset_id: str, name: str,
                      type_json: dict[str, Any], shape: tuple[int, ...],
                      chunks: tuple[int, ...]) -> Path:
    """Write domain ``domain`` (e.g. ``home/admin/f.h5``) whose root group
    ``root_id`` links dataset ``dset_id`` as ``name``; the dataset's chunk
    directory, where chunk ``i_j`` goes, is returned."""
    uuid1 = root_id[2:19]
    db = bucket / "db" / uuid1
    (bucket / domain).mkdir(parents=True)
    (bucket / domain / ".domain.json").write_text(json.dumps(
        {"root": root_id, "owner": "admin", "acls": {}, "created": 1.0, "lastModified": 2.0}))
    db.mkdir(parents=True)
    (db / ".group.json").write_text(json.dumps(
        {"id": root_id, "root": root_id, "created": 1.0, "lastModified": 2.0,
         "links": {name: {"class": "H5L_TYPE_HARD", "created": 1.0, "id": dset_id}},
         "attributes": {}}))
    dset = db / "d" / dset_id[20:]
    dset.mkdir(parents=True)
    (dset / ".dataset.json").write_text(json.dumps(
        {"id": dset_id, "root": root_id, "created": 1.0, "lastModified": 2.0,
         "type": type_json,
         "shape": {"class": "H5S_SIMPLE", "dims": list(shape), "maxdims": list(shape)},
         "attributes": {},
         "creationProperties": {"layout": {"class": "H5D_CHUNKED", "dims": list(chunks)}}}))
    return dset
