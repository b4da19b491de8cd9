"""The peer of the first open of a ``D.h5``: h5py making a domain's skeleton in memory.

This module owns the peer process of ``bench.bench_walk``'s ``h5open``
group: h5py writes, into an in-memory file (the ``core`` driver, no backing
store), the skeleton of a walk domain as ``bench.walkdata``'s recipe makes
it (``links`` int32 datasets of shape (4,), chunked and extendible or
gzip-filtered where the recipe says, each with its ``index`` attribute; no
elements written, as ``D.h5`` writes none) and closes it. It is what the
daemon's build of that ``D.h5`` does at least, without the mount.

Run from the repository root::

    .venv/bin/python -m bench.skeleton_peer [LINKS]
"""

from __future__ import annotations

import sys

import h5py
import numpy as np

from bench import scaledata, walkdata


def make(links: int) -> None:
    """Write the skeleton of a walk domain of ``links`` datasets in memory."""
    with h5py.File("skeleton.h5", "w", driver="core", backing_store=False) as f:
        for i in range(links):
            chunked = walkdata.is_gzip(i) or walkdata.is_extendible(i)
            ds = f.create_dataset(
                scaledata.link_name(i), shape=(4,), dtype="<i4",
                chunks=(4,) if chunked else None,
                maxshape=(None,) if walkdata.is_extendible(i) else None,
                compression="gzip" if walkdata.is_gzip(i) else None)
            ds.attrs["index"] = np.int32(i)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    make(int(args[0]) if args else walkdata.LINKS[walkdata.WALK10K])
    return 0


if __name__ == "__main__":
    sys.exit(main())
