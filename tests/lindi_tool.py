"""Writes and reads real LINDI files with lindi itself, for the tests.

A standalone script: stdlib, numpy, h5py and lindi only (no h5mount import),
run with the interpreter of ``.venv-lindi`` (lindi 0.4.6 needs zarr 2)::

    python tests/lindi_tool.py json H5 OUT.lindi.json [--url URL] [--threshold N]
    python tests/lindi_tool.py tar  H5 OUT.lindi.tar  [--url URL] [--threshold N] [--blobs N]
    python tests/lindi_tool.py dir  H5 OUT.lindi.d    [--url URL] [--threshold N] [--blobs N]
    python tests/lindi_tool.py read LINDI [KEY ...] [--raw]

``json`` is ``LindiH5ZarrStore.from_file(H5, url=URL).write_reference_file_system``;
``tar``/``dir`` are ``LindiH5pyFile.from_hdf5_file(H5, url=URL).write_lindi_file``.
``URL`` (what the chunk refs name) defaults to the absolute path of ``H5``.
``--threshold N`` makes datasets of more than N chunks external array links.
``--blobs N`` then opens the tar or directory read-write and adds N datasets
``blob_I`` (two uncompressed 8000-byte chunks each, which lindi stores as
``./blobs/...`` members) and one tiny inline dataset ``tiny``; enough of them
make lindi move ``lindi.json`` and ``.tar_index.json`` to the tar's end.
``read`` prints ``{key: base64 or null}`` of what lindi's own reader returns
for each key (all keys if none are given); ``--raw`` skips lindi's zero
padding of short final chunks.

Concurrency: none; one process writes one file.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys

import lindi
import numpy as np

BLOB_ELEMENTS = 2000
BLOB_CHUNK = 1000


def _opts(threshold: int | None) -> lindi.LindiH5ZarrStoreOpts | None:
    if threshold is None:
        return None
    return lindi.LindiH5ZarrStoreOpts(num_dataset_chunks_threshold=threshold)


def write_json(h5: str, out: str, url: str, threshold: int | None) -> None:
    store = lindi.LindiH5ZarrStore.from_file(h5, url=url, opts=_opts(threshold))
    try:
        store.write_reference_file_system(out)
    finally:
        store.close()


def write_container(h5: str, out: str, url: str, threshold: int | None, blobs: int) -> None:
    source = lindi.LindiH5pyFile.from_hdf5_file(h5, url=url, zarr_store_opts=_opts(threshold))
    source.write_lindi_file(out)
    source.close()
    if not blobs:
        return
    rng = np.random.default_rng(5)
    with lindi.LindiH5pyFile.from_lindi_file(out, mode="r+") as f:
        for i in range(blobs):
            f.create_dataset(f"blob_{i}", data=rng.random(BLOB_ELEMENTS), chunks=(BLOB_CHUNK,),
                             compression=None)
        f.create_dataset("tiny", data=np.arange(3, dtype="<i4"))


def read(path: str, keys: list[str], raw: bool) -> dict[str, str | None]:
    f = lindi.LindiH5pyFile.from_lindi_file(path)
    store = f._zarr_store
    base = getattr(store, "_base_store", store)
    out: dict[str, str | None] = {}
    for key in keys or list(base):
        value = base._get_helper(key) if raw else store[key]
        out[key] = None if value is None else base64.b64encode(value).decode("ascii")
    f.close()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("json", "tar", "dir"):
        p = sub.add_parser(name)
        p.add_argument("h5")
        p.add_argument("out")
        p.add_argument("--url")
        p.add_argument("--threshold", type=int)
        if name != "json":
            p.add_argument("--blobs", type=int, default=0)
    p = sub.add_parser("read")
    p.add_argument("path")
    p.add_argument("keys", nargs="*")
    p.add_argument("--raw", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "read":
        json.dump(read(args.path, args.keys, args.raw), sys.stdout)
        return 0
    url = args.url or os.path.abspath(args.h5)
    if args.command == "json":
        write_json(args.h5, args.out, url, args.threshold)
    else:
        write_container(args.h5, args.out, url, args.threshold, args.blobs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
