"""PyTables comparing two HDF5 files leaf by leaf, in a process of its own.

``python tests/pytables_tool.py ORIGINAL VIEW`` prints one JSON object: the
number of leaves of ORIGINAL, the PyTables classes among them, and the
differences (``"PATH: only in the view"``, ``"PATH: Table -> UnImplemented"``,
``"PATH: values differ"``). PyTables bundles its own HDF5 library, so it must
not share a process with h5py (``tests/test_h5view_pytables.py`` runs this).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import numpy as np
import tables


def leaves(path: str) -> dict[str, tuple[str, Any]]:
    """Every leaf of the file: its PyTables class and what it reads."""
    out: dict[str, tuple[str, Any]] = {}
    with tables.open_file(path) as f:
        for node in f.walk_nodes("/"):
            if isinstance(node, tables.Leaf):
                try:
                    value: Any = node.read()
                except (tables.HDF5ExtError, ValueError, TypeError, AttributeError) as exc:
                    value = f"unreadable: {type(exc).__name__}"  # UnImplemented has no read
                out[node._v_pathname] = (type(node).__name__, value)
    return out


def differences(want: dict[str, tuple[str, Any]], got: dict[str, tuple[str, Any]]) -> list[str]:
    out = []
    for path in sorted(set(want) | set(got)):
        if path not in got or path not in want:
            out.append(f"{path}: only in the {'view' if path in got else 'original'}")
        elif want[path][0] != got[path][0]:
            out.append(f"{path}: {want[path][0]} -> {got[path][0]}")
        else:
            try:
                np.testing.assert_equal(got[path][1], want[path][1])
            except (AssertionError, TypeError):
                out.append(f"{path}: values differ")
    return out


def main() -> None:
    warnings.simplefilter("ignore")  # PyTables warns of old formats
    want, got = leaves(sys.argv[1]), leaves(sys.argv[2])
    print(json.dumps({"leaves": len(want), "classes": sorted({c for c, _ in want.values()}),
                      "diffs": differences(want, got)}))


if __name__ == "__main__":
    main()
