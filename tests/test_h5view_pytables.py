"""PyTables reading its own test files through ``D.h5``.

The test files PyTables ships (``tables/tests/*.h5``) are hsloaded into a real
HSDS; the view of each domain on the mount is opened with PyTables and
compared with the original file, leaf by leaf: the class PyTables gives the
leaf (``Table``, ``EArray``, ``CArray``, ``Array``, ``VLArray``...) and every
value it reads. PyTables runs in a process of its own (``tests/pytables_tool.py``):
it bundles its own HDF5 library, which must not share a process with h5py's.

Left out: the files hsload cannot load (``NOT_LOADED``, each with the reason).
Every other difference is named in ``EXPECTED``, with its reason; any
difference not named there fails, and so does a named one that is gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hsds_server import HsdsServer, hsds_node_available
from tests.mounting import mounted

pytestmark = [pytest.mark.mount, pytest.mark.hsds]

tables = pytest.importorskip("tables")
SOURCE = Path(tables.__file__).parent / "tests"
TOOL = Path(__file__).parent / "pytables_tool.py"

#: Test files the bucket does not hold, and why (hsload's own error where it fails).
NOT_LOADED = {
    **{name: "hsload: \"filter unknown is unknown\" (LZO)" for name in (
        "Table2_1_lzo_nrv2e_shuffle.h5", "Tables_lzo1.h5", "Tables_lzo1_shuffle.h5",
        "Tables_lzo2.h5", "Tables_lzo2_shuffle.h5")},
    "b2nd-no-chunkshape.h5": "hsload: \"filter unknown is unknown\" (Blosc2)",
    "blosc_bigendian.h5": "hsload: \"filter unknown is unknown\" (Blosc)",
    "test_szip.h5": "hsload: HSDS answers 400 to its szip dataset",
    "array_mdatom.h5": "hsload: ValueError on its multidimensional atoms",
    "attr-u16.h5": "hsload: \"data type '>u16' not understood\"",
    "float.h5": "hsload: \"Unexpected floating point type: float128\"",
    "smpl_unsupptype.h5": "hsload: IndexError on a type PyTables itself does not support",
    "time-table-vlarray-1_x.h5": "hsload: \"No NumPy equivalent for TypeTimeID exists\"",
    "times-nested-be.h5": "hsload: \"No NumPy equivalent for TypeTimeID exists\"",
    "vlunicode_endian.h5": "hsload: ValueError on its variable-length unicode",
    "nested-type-with-gaps.h5": "HSDS leaves one of its chunks unstored after a flush, and "
                                "PyTables crashes (heap corruption) reading the original itself",
    "ex-noattr.h5": "the bucket check (h5py) cannot read its undefined fill value",
}
#: Differences between the view and the original, by file, with the reason.
EXPECTED = {
    "out_of_order_types.h5": {
        "/group/table: values differ": "hsload orders compound members by offset"},
}


@pytest.fixture(scope="module")
def views(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """The mount of a bucket holding every test file hsload takes, and their names."""
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed (pip install 'hsds==1.0.2' h5pyd)")
    base = tmp_path_factory.mktemp("pytables")
    names = sorted(p.name for p in SOURCE.glob("*.h5") if p.name not in NOT_LOADED)
    server = HsdsServer(base / "root", "pytables", log_dir=base / "logs")
    with server:
        for name in names:
            server.load(SOURCE / name, f"/home/admin/{name}")
        for name in names:
            server.flush_and_verify(f"/home/admin/{name}", SOURCE / name)
    with mounted(base / "root" / "pytables", base / "mnt") as mp:
        yield mp / "home" / "admin", names


def test_pytables_reads_its_files_through_the_view(views: tuple[Path, list[str]]) -> None:
    folder, names = views
    assert len(names) >= 29
    found: dict[str, dict[str, str]] = {}
    classes: set[str] = set()
    for name in names:
        done = subprocess.run([sys.executable, str(TOOL), str(SOURCE / name),
                               str(folder / f"{name}.h5")], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, (name, done.stderr[-2000:])
        result = json.loads(done.stdout)
        classes.update(result["classes"])
        if result["diffs"]:
            found[name] = {diff: EXPECTED.get(name, {}).get(diff, "unexpected")
                           for diff in result["diffs"]}
    assert found == EXPECTED
    assert {"Table", "EArray", "CArray", "Array", "VLArray"} <= classes
