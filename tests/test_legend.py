"""LEGEND views (``layouts.views.legend._views``): real LH5 files, real mounts, real readers.

Files:

* ``events.lh5``, written by legend-pydataobj (``lgdo``) and legend-lh5io
  (``lh5``) in ``.venv-conv`` (``tests/legend_tool.py``): a table with
  scalar-per-row, bool, string, vector-of-vectors, equal-sized-array,
  enum-like and nested-table columns with units; a scalar, a struct, a 2-D
  equal-sized array and a vector of vectors alone;
* ``cumsum.h5``, written here with h5py in the format document's own layout
  (a flat dataset whose ``cumsum_length`` attribute refers to the
  cumulative lengths, or names them), alone and as a table column, plus
  hostile objects: a ``datatype`` nested too deep, an enum naming a member
  twice, cumulative lengths that go down or past the values, tables nested
  too deep, a table missing a column.

Both are mounted for real (``tests/mounting.py``) twice: hsloaded into a
real HSDS bucket (``tests/hsds_server.py``, started by this module for its
two files) and as LINDI reference files written by lindi
(``tests/lindi_files.py``). ``pandas.read_csv`` of each CSV and
``json.loads`` of each JSON line are compared with what lgdo reads
(``legend_tool.py read``) or, for ``cumsum.h5``, with h5py; ``stat``,
``wc -c``, ``cp``, ``rsync``, ``shutil.copyfile`` and ``tail -c`` agree on
every view file's size. The grammar parser is also tested alone, and the
head of a large in-memory table's CSV is checked to read only the first
chunk of each column once its size is known.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pytest
import trio

from layouts.model import (
    Attribute,
    ChunkIndex,
    Dataset,
    Domain,
    ElementType,
    Group,
    Link,
    LinkKind,
    ObjectKind,
)
from layouts.views import VIEWS
from layouts.views.legend._columns import MAX_TABLE_DEPTH
from layouts.views.legend._types import (
    MAX_DEPTH,
    ArrayOf,
    DatatypeError,
    Enum,
    Fields,
    Scalar,
    is_vector_of_vectors,
    parse_datatype,
    type_json,
)
from mountd.cache.metacache import CachedCatalog
from mountd.tree import make_tree
from mountd.tree.core import Tree
from mountd.tree.nodes import DirNode, FileNode, Node
from tests import tiers
from tests.hsds_server import HsdsServer, hsds_node_available
from tests.lindi_files import write_lindi
from tests.modelcat import MemoryCatalog, MemoryChunks
from tests.mounting import fuse_available, mounted

ROOT = Path(__file__).resolve().parents[1]
CONV_PYTHON = ROOT / ".venv-conv" / "bin" / "python"
LEGEND_TOOL = Path(__file__).with_name("legend_tool.py")

#: Rows of the lgdo table and of its columns' chunks: several blocks and chunks.
ROWS = 3000
CHUNK = 256
#: What ``legend_tool.py read`` is asked for.
LGDO_OBJECTS = ("events", "runtime", "meta", "matrix", "tracks")
#: Rows of ``cumsum.h5``'s vector of vectors.
CUMSUM_ROWS = 700
BUCKET = "legendtest"

def needs_fuse(test: Callable[..., None]) -> Callable[..., None]:
    """A test of the mounted views: real mounts of an HSDS bucket and of LINDI
    files, written with lgdo (``tools``)."""
    for mark in (pytest.mark.mount, pytest.mark.hsds, pytest.mark.tools,
                 pytest.mark.skipif(fuse_available() is not None,
                                    reason=f"no FUSE: {fuse_available()}")):
        test = mark(test)
    return test


# --------------------------------------------------------------------------- grammar


@pytest.mark.parametrize(("text", "want"), [
    ("real", {"kind": "real"}),
    ("array<1>{real}", {"kind": "array", "dims": [1], "element": {"kind": "real"}}),
    ("fixedsize_array<1>{bool}",
     {"kind": "fixedsize_array", "dims": [1], "element": {"kind": "bool"}}),
    ("array_of_equalsized_arrays<1,1>{real}",
     {"kind": "array_of_equalsized_arrays", "dims": [1, 1], "element": {"kind": "real"}}),
    (" array < 1 > { array<1>{ string } } ",
     {"kind": "array", "dims": [1],
      "element": {"kind": "array", "dims": [1], "element": {"kind": "string"}}}),
    ("table{a, b,c}", {"kind": "table", "fields": ["a", "b", "c"]}),
    ("struct{}", {"kind": "struct", "fields": []}),
    ("enum{OFF=0,ON=1, BAD = -3}", {"kind": "enum", "members": {"OFF": 0, "ON": 1, "BAD": -3}}),
    ("array<1>{array<1>{enum{A=0,B=1}}}",
     {"kind": "array", "dims": [1], "element": {"kind": "array", "dims": [1], "element": {
         "kind": "enum", "members": {"A": 0, "B": 1}}}}),
    ("array<1>{encoded_array<1>{real}}",
     {"kind": "array", "dims": [1],
      "element": {"kind": "encoded_array", "dims": [1], "element": {"kind": "real"}}}),
    ("symbol", {"kind": "symbol"}),
])
def test_grammar_parses(text: str, want: dict[str, Any]) -> None:
    assert type_json(parse_datatype(text)) == want


def test_grammar_shapes() -> None:
    vov = parse_datatype("array<1>{array<1>{real}}")
    assert is_vector_of_vectors(vov)
    assert not is_vector_of_vectors(parse_datatype("array<1>{real}"))
    assert not is_vector_of_vectors(parse_datatype("array<2>{array<1>{real}}"))
    assert parse_datatype("table{x}") == Fields("table", ("x",))
    enum = parse_datatype("enum{A=1,B=1,C=2}")
    assert isinstance(enum, Enum) and enum.names() == {1: "A", 2: "C"}
    assert parse_datatype("array<3>{real}") == ArrayOf("array", (3,), Scalar("real"))


@pytest.mark.parametrize("text", [
    "", "   ", "{", "}", "array", "array{real}", "array<>{real}", "array<1,2>{real}",
    "array<1>{real", "array<1>{real}}", "array<1>{}", "array<x>{real}", "array<99>{real}",
    "array<" + "9" * 5000 + ">{real}", "real<1>", "real{x}", "view{x}", "table{a,a}",
    "table{a/b}", "table{..}", "table{a,,b}", "table{a{b}}", "enum{A}", "enum{A=}",
    "enum{A=1,A=2}", "enum{A=" + "9" * 30 + "}", "enum{A=" + "9" * 5000 + "}", "real real",
    "array<1>{" * (MAX_DEPTH + 1) + "real" + "}" * (MAX_DEPTH + 1),
    "array<1>{" * 100_000, "{" * 100_000, "table{" + "a," * 40_000 + "b}",
    "\x00", "array<1>{re\x00al}",
])
def test_grammar_refuses_cleanly(text: str) -> None:
    with pytest.raises(DatatypeError):
        parse_datatype(text)


def test_grammar_random_text_never_crashes() -> None:
    """Any text gives a type or a DatatypeError, never another exception."""
    rng = np.random.default_rng(7)
    alphabet = [*"array<>{},=01_ -tablenumstrucelqd", "array<1>{", "enum{", "table{"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet, int(rng.integers(0, 40))))
        with contextlib.suppress(DatatypeError):
            type_json(parse_datatype(text))


# --------------------------------------------------------------------------- streaming


class CountingChunks(MemoryChunks):
    """Chunks in memory that remember which were read."""

    def __init__(self, chunks: dict[ChunkIndex, bytes]) -> None:
        super().__init__(chunks)
        self.reads: list[ChunkIndex] = []

    async def read(self, index: ChunkIndex) -> bytes | None:
        self.reads.append(index)
        return await super().read(index)


def column(obj_id: str, data: np.ndarray, chunk: int, datatype: str) -> Dataset:
    blocks = {(i,): np.resize(data[i * chunk:(i + 1) * chunk], chunk).tobytes()
              for i in range(-(-len(data) // chunk))}
    return Dataset(id=obj_id, shape=data.shape, maxshape=data.shape, chunks=(chunk,),
                   type=ElementType(data.dtype, data.dtype.str, {}), fill_value=None,
                   store=CountingChunks(blocks),
                   attrs=(Attribute("datatype", datatype),))


def hard(obj_id: str) -> Link:
    kind = ObjectKind.GROUP if obj_id.startswith("g") else ObjectKind.DATASET
    return Link(LinkKind.HARD, obj_id, target_kind=kind)


@pytest.mark.slow
def test_head_of_a_large_table_reads_only_its_first_chunks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``events.csv`` of a 500k-row table in memory: once its size is known
    (the first ``stat`` streams it once), its first 4 KiB are streamed from
    the first chunk of each column, nothing else. The count and the head are
    read in one ``metadata_ttl`` period: a period that ends between them (it
    happened in one CI run, and in 1 of 8 runs beside two CPU hogs) rightly
    has the head count these small columns again."""
    monkeypatch.setattr(Tree, "epoch", lambda self: (0, 0))
    rows, chunk = 500_000, 20_000
    lengths = np.arange(rows, dtype="<i8") % 3
    objects: dict[str, Any] = {
        "d-energy": column("d-energy", np.arange(rows, dtype="<f8") / 4, chunk,
                           "array<1>{real}"),
        "d-state": column("d-state", (np.arange(rows) % 2).astype("u1"), chunk,
                          "array<1>{enum{OFF=0,ON=1}}"),
        "d-ends": column("d-ends", np.cumsum(lengths), chunk, "array<1>{real}"),
        "d-flat": column("d-flat", np.arange(int(lengths.sum()), dtype="<i4"), chunk,
                         "array<1>{real}"),
    }
    objects["g-hits"] = Group(id="g-hits", links={"cumulative_length": hard("d-ends"),
                                                  "flattened_data": hard("d-flat")},
                              attrs=(Attribute("datatype", "array<1>{array<1>{real}}"),))
    objects["g-events"] = Group(
        id="g-events", links={"energy": hard("d-energy"), "hits": hard("g-hits"),
                              "state": hard("d-state")},
        attrs=(Attribute("datatype", "table{energy,hits,state}"),))
    objects["g-root"] = Group(id="g-root", links={"events": hard("g-events")})
    catalog = MemoryCatalog({"f.lh5": Domain("f.lh5", "g-root")}, objects, {"": ["f.lh5"]},
                            single_domain="f.lh5")
    stores = ("d-energy", "d-state", "d-ends", "d-flat")

    async def main() -> bytes:
        node: Node = await make_tree(CachedCatalog(catalog, ttl=60), views=VIEWS).root()
        assert isinstance(node, DirNode)
        node = await node.lookup("events.csv")
        assert isinstance(node, FileNode)
        size = (await node.stat()).size  # streams the whole table once, to count it
        for name in stores:
            objects[name].store.reads.clear()
        handle = await node.open()
        head = bytes(await handle.read(0, 4096))
        assert len(head) == 4096 < size
        return head

    head = trio.run(main).decode()
    lines = head.splitlines()
    assert lines[0] == "energy,hits,state"
    assert lines[1:4] == ["0.0,[],OFF", "0.25,[0],ON", '0.5,"[1,2]",OFF']
    for name in stores:
        assert set(objects[name].store.reads) == {(0,)}, name


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class LegendFiles:
    lh5: Path
    cumsum: Path
    #: ``legend_tool.py read``'s answer: ``{"objects": ..., "enums": ...}``.
    lgdo: dict[str, Any]


def _conv_ready() -> str | None:
    """None if ``.venv-conv`` can write LH5 files, else why not."""
    if not CONV_PYTHON.exists():
        return f"{CONV_PYTHON} is missing (run dev/setup)"
    done = subprocess.run([str(CONV_PYTHON), "-c", "import lgdo, lh5"],
                          capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"lgdo/lh5 not importable: {done.stderr[-300:]}"


def cumsum_rows() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    rows = [rng.random(int(n)) * 10 for n in rng.integers(0, 6, CUMSUM_ROWS)]
    rows[0] = np.array([])
    rows[1] = np.array([np.nan, 1.0])
    return rows


def write_cumsum(path: Path) -> None:
    """The format document's vector-of-vectors layout, written with h5py, and hostile objects."""
    rows = cumsum_rows()
    lengths = np.cumsum([len(r) for r in rows])
    with h5py.File(path, "w") as f:
        cl = f.create_dataset("energies_cumsum", data=lengths, chunks=(100,))
        data = f.create_dataset("energies", data=np.concatenate(rows), chunks=(128,))
        data.attrs["datatype"] = "array<1>{array<1>{real}}"
        data.attrs["units"] = "keV"
        data.attrs["cumsum_length"] = cl.ref
        # the same, naming the lengths instead (the format document's first way)
        named = f.create_dataset("named", data=data[()], chunks=(128,))
        named.attrs["datatype"] = "array<1>{array<1>{real}}"
        named.attrs["cumsum_length"] = "energies_cumsum"

        table = f.create_group("hits")
        table.attrs["datatype"] = "table{channel,values,state}"
        channel = table.create_dataset("channel", data=np.arange(4, dtype="<u2"))
        channel.attrs["datatype"] = "array<1>{real}"
        table_cl = table.create_dataset("values_cumsum", data=np.array([2, 2, 3, 6], ">i8"))
        values = table.create_dataset("values", data=np.array([1, 2, 3, 4, 5, 6], ">i4"))
        values.attrs["datatype"] = "array<1>{array<1>{real}}"
        values.attrs["units"] = "mm"
        values.attrs["cumsum_length"] = table_cl.ref
        state = table.create_dataset("state", data=np.array([1, 0, 2, 7], "u1"))
        state.attrs["datatype"] = "array<1>{enum{OFF=0,ON=1,BROKEN=2}}"

        deep = f.create_dataset("deep", data=np.arange(3))
        deep.attrs["datatype"] = "array<1>{" * 40 + "real" + "}" * 40
        twice = f.create_dataset("twice", data=np.arange(3))
        twice.attrs["datatype"] = "array<1>{enum{A=1,A=2}}"
        for name, ends in (("down", [2, 1, 5]), ("past", [2, 99])):
            group = f.create_group(name)
            group.attrs["datatype"] = "array<1>{array<1>{real}}"
            group["flattened_data"] = np.arange(5.0)
            group["cumulative_length"] = np.array(ends)
        nested = f.create_group("nested")
        for _ in range(MAX_TABLE_DEPTH + 2):
            nested.attrs["datatype"] = "table{x,t}"
            nested["x"] = np.arange(3)
            nested = nested.create_group("t")
        nested.attrs["datatype"] = "table{x}"
        nested["x"] = np.arange(3)
        missing = f.create_group("missing")
        missing.attrs["datatype"] = "table{x,nothere}"
        missing["x"] = np.arange(3)


@pytest.fixture(scope="module")
def legend_files(tmp_path_factory: pytest.TempPathFactory) -> LegendFiles:
    why = _conv_ready()
    if why is not None:
        pytest.skip(why)
    tiers.uses("tools")
    base = tmp_path_factory.mktemp("legend-src")
    lh5 = base / "events.lh5"
    subprocess.run([str(CONV_PYTHON), str(LEGEND_TOOL), "write", str(lh5), "--rows", str(ROWS),
                    "--chunk", str(CHUNK)], check=True, capture_output=True)
    done = subprocess.run([str(CONV_PYTHON), str(LEGEND_TOOL), "read", str(lh5), *LGDO_OBJECTS],
                          check=True, capture_output=True, text=True)
    cumsum = base / "cumsum.h5"
    write_cumsum(cumsum)
    return LegendFiles(lh5, cumsum, json.loads(done.stdout))


@pytest.fixture(scope="module")
def hsds_legend(legend_files: LegendFiles, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both files hsloaded into a real HSDS bucket, flushed and checked; HSDS stopped."""
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed")
    base = tmp_path_factory.mktemp("legend-hsds")
    server = HsdsServer(base / "root", BUCKET, log_dir=base / "logs")
    files = {"home/admin/events.lh5": legend_files.lh5, "home/admin/cumsum.h5": legend_files.cumsum}
    with server:
        for domain, source in files.items():
            server.load(source, domain)
        for domain, source in files.items():
            server.flush_and_verify(domain, source)
    return server.bucket_dir


@pytest.fixture(scope="module", params=["hsds", "lindi"])
def roots(request: pytest.FixtureRequest, legend_files: LegendFiles,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """``{"events": root group dir, "cumsum": root group dir}`` of a live mount."""
    if fuse_available() is not None:
        pytest.skip(f"no FUSE: {fuse_available()}")
    base = tmp_path_factory.mktemp(f"legend-{request.param}")
    with contextlib.ExitStack() as stack:
        if request.param == "hsds":
            bucket = request.getfixturevalue("hsds_legend")
            mp = stack.enter_context(mounted(bucket, base / "mnt"))
            yield {"events": mp / "home/admin/events.lh5", "cumsum": mp / "home/admin/cumsum.h5"}
            return
        out = {}
        for name, source in (("events", legend_files.lh5), ("cumsum", legend_files.cumsum)):
            ref = write_lindi("json", source, base / f"{name}.lindi.json")
            out[name] = stack.enter_context(mounted(ref, base / f"mnt-{name}"))
        yield out


# --------------------------------------------------------------------------- helpers


def header(name: str, attrs: dict[str, Any]) -> str:
    units = attrs.get("units")
    return f"{name}[{units}]" if units else name


def enum_names(datatype: str) -> dict[int, str]:
    """Value -> name of the (first) ``enum{...}`` in a datatype text."""
    body = re.search(r"enum\{([^{}]*)\}", datatype)
    assert body is not None, datatype
    return {int(v): k for k, v in re.findall(r"(\w+)=(-?\d+)", body.group(1))}


def read_csv(path: Path) -> pd.DataFrame:
    """A view CSV as pandas reads it, strings kept as written (``nan`` is a float)."""
    return pd.read_csv(path, keep_default_na=False, na_values=["nan"])


def json_lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def same_numbers(got: Any, want: Any, dtype: str = "f8") -> None:
    """Equal as ``dtype`` (NaN equal to NaN, JSON ``null`` to NaN), nested lists too."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for g, w in zip(got, want, strict=True):
            same_numbers(g, w, dtype)
        return
    g = np.asarray(np.nan if got is None else got, dtype=dtype)
    w = np.asarray(np.nan if want is None else want, dtype=dtype)
    assert g.tobytes() == w.tobytes() or (np.isnan(g) and np.isnan(w)), (got, want)


def check_column(frame: pd.DataFrame, name: str, column: dict[str, Any],
                 enums: dict[str, str]) -> None:
    """One CSV column against lgdo's values for it."""
    got = frame[header(name, column["attrs"])].tolist()
    want = column["values"]
    datatype = enums.get(f"events/{name}")
    assert len(got) == len(want) == ROWS
    if datatype is not None and datatype.startswith("array<1>{array<1>"):
        names = enum_names(datatype)
        assert [json.loads(g) for g in got] == [[names[v] for v in row] for row in want]
    elif datatype is not None:
        names = enum_names(datatype)
        assert got == [names[v] for v in want]
    elif column["attrs"]["datatype"].startswith(("array<1>{array<1>",
                                                 "array_of_equalsized_arrays")):
        same_numbers([json.loads(g) for g in got], want,
                     "f4" if name in {"hits", "wf"} else "i8")
    elif column["attrs"]["datatype"] == "array<1>{string}":
        assert got == want
    elif column["attrs"]["datatype"] == "array<1>{bool}":
        assert got == want and all(isinstance(g, bool) for g in got)
    else:
        same_numbers(got, want)


# --------------------------------------------------------------------------- mounted views


@needs_fuse
def test_table_csv_equals_lgdo(roots: dict[str, Path], legend_files: LegendFiles) -> None:
    events = legend_files.lgdo["objects"]["events"]["columns"]
    enums = legend_files.lgdo["enums"]
    frame = read_csv(roots["events"] / "events.csv")
    # one column per field in the order of table{...}, nested tables flattened
    order = parse_datatype(legend_files.lgdo["objects"]["events"]["datatype"])
    assert isinstance(order, Fields)
    want_headers = []
    for field in order.names:
        for name, column in events.items():
            if name == field or name.startswith(field + "."):
                want_headers.append(header(name, column["attrs"]))
    assert list(frame.columns) == want_headers
    assert "energy[keV]" in want_headers and "sub.x[mm]" in want_headers
    for name, column in events.items():
        check_column(frame, name, column, enums)
    # the nested table has a CSV of its own, headed by its own field names
    sub = read_csv(roots["events"] / "events" / "sub.csv")
    assert list(sub.columns) == ["x[mm]", "y"]
    same_numbers(sub["y"].tolist(), events["sub.y"]["values"])


@needs_fuse
def test_vectors_jsonl_equal_lgdo(roots: dict[str, Path], legend_files: LegendFiles) -> None:
    objects = legend_files.lgdo["objects"]
    events = objects["events"]["columns"]
    root = roots["events"]
    same_numbers(json_lines(root / "events" / "hits.jsonl"), events["hits"]["values"], "f4")
    same_numbers(json_lines(root / "events" / "ids.jsonl"), events["ids"]["values"], "i8")
    names = enum_names(legend_files.lgdo["enums"]["events/trig"])
    assert json_lines(root / "events" / "trig.jsonl") == [
        [names[v] for v in row] for row in events["trig"]["values"]]
    assert json_lines(root / "tracks.jsonl") == objects["tracks"]["values"]
    # the parts of a vector of vectors are plain datasets: no views of their own
    assert not (root / "events" / "hits" / "flattened_data.jsonl").exists()


@needs_fuse
def test_equal_sized_arrays_csv(roots: dict[str, Path], legend_files: LegendFiles) -> None:
    objects = legend_files.lgdo["objects"]
    matrix = read_csv(roots["events"] / "matrix.csv")
    assert list(matrix.columns) == ["matrix.0[mV]", "matrix.1[mV]", "matrix.2[mV]"]
    assert matrix.to_numpy().tolist() == objects["matrix"]["values"]
    assert (roots["events"] / "matrix.npy").exists()
    wf = read_csv(roots["events"] / "events" / "wf.csv")
    assert list(wf.columns) == ["wf.0[ADC]", "wf.1[ADC]", "wf.2[ADC]"]
    same_numbers(wf.to_numpy().tolist(), objects["events"]["columns"]["wf"]["values"], "f4")
    # 1-D arrays have no CSV of their own
    assert not (roots["events"] / "events" / "energy.csv").exists()


@needs_fuse
def test_sidecar_legend_key(roots: dict[str, Path], legend_files: LegendFiles) -> None:
    root = roots["events"]

    def legend(path: str) -> dict[str, Any]:
        return json.loads((root / path).read_text())["legend"]

    table = legend("events.json")
    assert table["datatype"] == legend_files.lgdo["objects"]["events"]["datatype"]
    assert table["type"]["kind"] == "table" and table["rows"] == ROWS
    assert table["columns"] == list(read_csv(root / "events.csv").columns)
    assert legend("events/energy.json") == {
        "datatype": "array<1>{real}", "units": "keV",
        "type": {"kind": "array", "dims": [1], "element": {"kind": "real"}}}
    kind = legend("events/kind.json")
    assert kind["type"]["element"] == {"kind": "enum",
                                       "members": {"ALPHA": 0, "BETA": 1, "GAMMA": 2}}
    hits = legend("events/hits.json")
    assert (hits["layout"], hits["rows"], hits["units"]) == ("flattened_data", ROWS, "ns")
    assert legend("runtime.json") == {"datatype": "real", "units": "s", "type": {"kind": "real"}}
    meta = legend("meta.json")
    assert meta["type"] == {"kind": "struct", "fields": ["count", "edges", "note"]}
    assert meta["fields"] == {"count": {"datatype": "real"},
                              "edges": {"datatype": "array<1>{real}"},
                              "note": {"datatype": "string"}}
    assert legend("matrix.json")["units"] == "mV"
    # lh5 makes the root group a struct (of the first object it wrote)
    sidecar = root.with_name(root.name + ".json") if root.name.endswith(".lh5") \
        else root / ".root.json"
    top = json.loads(sidecar.read_text())["legend"]
    assert top["type"]["kind"] == "struct"
    assert top["fields"]["events"] == {"datatype": table["datatype"]}


@needs_fuse
def test_cumsum_length_layout(roots: dict[str, Path], legend_files: LegendFiles) -> None:
    """The format document's layout, against what h5py reads."""
    root = roots["cumsum"]
    rows = cumsum_rows()
    got = json_lines(root / "energies.jsonl")
    same_numbers(got, [r.tolist() for r in rows])
    assert json_lines(root / "named.jsonl") == got
    side = json.loads((root / "energies.json").read_text())["legend"]
    assert (side["layout"], side["rows"], side["units"]) == ("cumsum_length", CUMSUM_ROWS, "keV")
    with h5py.File(legend_files.cumsum) as f:
        ends = f["hits/values_cumsum"][()]
        flat = f["hits/values"][()]
        channel = f["hits/channel"][()]
    table = read_csv(root / "hits.csv")
    assert list(table.columns) == ["channel", "values[mm]", "state"]
    assert table["channel"].tolist() == channel.tolist()
    starts = [0, *ends[:-1]]
    assert [json.loads(v) for v in table["values[mm]"]] == [
        flat[a:b].tolist() for a, b in zip(starts, ends, strict=True)]
    assert table["state"].tolist() == ["ON", "OFF", "BROKEN", "7"]  # 7 is no member
    assert (root / "hits" / "values.jsonl").exists()


@needs_fuse
def test_hostile_objects_fail_alone(roots: dict[str, Path]) -> None:
    root = roots["cumsum"]

    def legend(name: str) -> dict[str, Any]:
        return json.loads((root / f"{name}.json").read_text())["legend"]

    for name in ("deep", "twice"):
        side = legend(name)
        assert "error" in side and "type" not in side, side
        assert not (root / f"{name}.jsonl").exists() and (root / f"{name}.npy").exists()
    for name in ("down", "past"):
        path = root / f"{name}.jsonl"
        with pytest.raises(OSError) as info:
            path.read_bytes()
        assert info.value.errno == errno.EIO, name
    for name in ("nested", "missing"):
        assert "error" in legend(name)
        with pytest.raises(OSError) as info:
            (root / f"{name}.csv").read_bytes()
        assert info.value.errno == errno.EIO, name
    # the rest of the file is still there
    assert json_lines(root / "energies.jsonl")[2:4] == [r.tolist() for r in cumsum_rows()[2:4]]


def view_files(roots: dict[str, Path]) -> list[Path]:
    return [roots["events"] / p for p in (
        "events.csv", "events/sub.csv", "events/wf.csv", "matrix.csv", "tracks.jsonl",
        "events/hits.jsonl", "events/ids.jsonl", "events/trig.jsonl")] + [
        roots["cumsum"] / p for p in ("energies.jsonl", "hits.csv", "hits/values.jsonl")]


@needs_fuse
def test_sizes_agree_with_tools(roots: dict[str, Path], tmp_path: Path) -> None:
    """``stat`` is exact: ``wc -c``, ``cp``, ``rsync``, ``shutil.copyfile`` and
    ``tail -c`` agree with it and with a plain read."""
    for i, path in enumerate(view_files(roots)):
        size = os.stat(path).st_size
        data = path.read_bytes()
        assert size == len(data) > 0, path
        wc = subprocess.run(["wc", "-c", str(path)], capture_output=True, text=True, check=True)
        assert int(wc.stdout.split()[0]) == size
        copies = tmp_path / str(i)
        copies.mkdir()
        subprocess.run(["cp", str(path), str(copies / "cp")], check=True)
        subprocess.run(["rsync", str(path), str(copies / "rsync")], check=True)
        shutil.copyfile(path, copies / "copyfile")
        for name in ("cp", "rsync", "copyfile"):
            assert (copies / name).read_bytes() == data, (path, name)
        tail = subprocess.run(["tail", "-c", "100", str(path)], capture_output=True, check=True)
        assert tail.stdout == data[-100:]
        head = subprocess.run(["head", "-c", "4096", str(path)], capture_output=True, check=True)
        assert head.stdout == data[:4096]
