"""The ``D.h5`` file view of every domain of the test bucket, read by tools no one here wrote.

For each domain the HSDS fixture loads, the mount's ``D.h5`` is read with
h5py and compared, object by object (links, kinds, attributes, dtypes,
shapes, fill values, every element, where references lead, dimension
scales), with h5pyd reading the same domain through a real HSDS. Debian's
``h5dump`` and ``h5ls -r`` (HDF5 1.10) must read every view, and ``h5diff``
must find no difference between a view and the file that was hsloaded,
except where HSDS itself changed the file (named below). A view names no
other file for its data: a copy of it taken with ``cp`` or ``tar`` reads the
same once the mount is gone, and so does the mount seen at another path (a
bind mount in a private mount namespace, with the first path gone there).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from tests import h5files
from tests.conftest import HsdsBucket
from tests.hsds_server import HsdsServer
from tests.mounting import mounted

pytestmark = [pytest.mark.mount, pytest.mark.hsds]

DOMAINS = sorted(load.domain for load in h5files.LOADS)
LEFT_OUT = "h5mount_left_out"
#: What a view leaves out on purpose: external links that lead out of the mount.
EXPECTED_LEFT_OUT = {
    "home/admin/links.h5": {"/escape_ext", "/escape_ext_rel", "/ext_missing"},
}
#: Objects h5diff finds different from the loaded file because HSDS changed them
#: (the view shows what HSDS stores, which h5pyd agrees with above): hsload
#: points external links at domains (the view at their D.h5 views).
H5DIFF_EXPECTED = {
    "home/admin/links.h5": {"external link /ext_data", "external link /ext_group"},
}
#: Datasets whose maximum shape differs from the loaded file's: hsload makes an
#: empty dataset extendible.
H5DIFF_MAXDIMS = {
    "home/admin/layout.h5": {"dataset /zero_size"},
}
#: Notes in ``LEFT_OUT`` about objects that are in the view nonetheless.
NOTED: dict[str, set[str]] = {}


#: Datasets whose elements h5pyd 1.0.0 with HSDS 1.0.2 does not read as stored,
#: compared with the loaded file instead (the mount's own ``.npy`` agrees with
#: it): h5pyd cannot decode fixed-length UTF-8 strings that are not ASCII
#: (UnicodeEncodeError), and HSDS serves different elements for chunks that
#: hsload stored with a shuffle or bitshuffle filter.
H5PYD_FAULTS = {
    ("home/admin/types.h5", "/strings/fixed_utf8"),
    ("home/admin/filters.h5", "/shuffle_only"),
    ("home/admin/plugins.h5", "/bitshuffle"),
    ("home/admin/plugins.h5", "/bitshuffle_lz4"),
}


#: Objects h5diff cannot compare besides empty datasets (which it never compares):
#: hsload stores an attribute of array type as a plain array of its base type.
H5DIFF_NOT_COMPARABLE = {
    "home/admin/types.h5": {"Not comparable: <array_attr> is of class H5T_ARRAY and "
                            "<array_attr> is of class H5T_FLOAT"},
}


REPO = Path(__file__).resolve().parent.parent


def _view(mnt: Path, domain: str) -> Path:
    return mnt / f"{domain}.h5"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (apt-get install hdf5-tools; dev/setup does)")
    return path


@pytest.fixture(scope="module")
def hsds_reader(hsds_bucket: HsdsBucket, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[HsdsServer]:
    """A real HSDS serving the fixture's bucket again, for h5pyd to read."""
    server = HsdsServer(hsds_bucket.root_dir, hsds_bucket.bucket,
                        log_dir=tmp_path_factory.mktemp("hsds-reader-logs"))
    with server:
        yield server


# --------------------------------------------------------------------------- canonical form


def _canon_dtype(dt: np.dtype[Any]) -> Any:
    """A dtype as h5py and h5pyd both describe it, metadata included."""
    enum = h5py.check_enum_dtype(dt)
    if enum is not None:
        return ["enum", dt.str, sorted(enum.items())]
    string = h5py.check_string_dtype(dt)
    if string is not None:
        return ["str", string.encoding, string.length]
    vlen = h5py.check_vlen_dtype(dt)
    if vlen is not None:
        return ["vlen", _canon_dtype(vlen)]
    if h5py.check_ref_dtype(dt) is not None:
        return ["ref"]
    if dt.names is not None:
        assert dt.fields is not None
        return [[name, _canon_dtype(dt.fields[name][0])] for name in dt.names]
    if dt.subdtype is not None:
        return ["array", _canon_dtype(dt.subdtype[0]), list(dt.subdtype[1])]
    return dt.str


def _fixed(dt: np.dtype[Any]) -> bool:
    """True if a dtype has no variable-length or reference part."""
    if dt.names is not None:
        assert dt.fields is not None
        return all(_fixed(dt.fields[name][0]) for name in dt.names)
    if dt.subdtype is not None:
        return _fixed(dt.subdtype[0])
    return dt.kind != "O"


class _Walk:
    """Every link of a file, breadth first in name order, as comparable values.
    Objects are named by the first path that reaches them, so references and
    hard links compare across files whose internal ids differ.

    ``hsds``: the file is h5pyd's, which gives object references as the HSDS
    id strings they are stored as (a reference dataset as ``S48``): those
    become references again.
    """

    def __init__(self, f: Any, hsds: bool = False) -> None:
        self.f = f
        self.hsds = hsds
        self.first: dict[Any, str] = {}
        self.out: dict[str, Any] = {}
        raw: list[tuple[str, Any]] = [("/", f["/"])]
        self.first[self._identity(f["/"])] = "/"
        queue: deque[tuple[str, Any]] = deque(raw)
        while queue:
            path, group = queue.popleft()
            for name in sorted(group):
                child = f"{path.rstrip('/')}/{name}"
                link = group.get(name, getlink=True)
                kind = type(link).__name__
                if kind == "SoftLink":
                    self.out[child] = ["soft", link.path]
                    continue
                if kind == "ExternalLink":
                    self.out[child] = ["external", link.path]
                    continue
                obj = group[name]
                key = self._identity(obj)
                if key in self.first:
                    self.out[child] = ["hard", self.first[key]]
                    continue
                self.first[key] = child
                raw.append((child, obj))
                if isinstance(obj.id, h5py.h5g.GroupID) or type(obj).__name__ == "Group":
                    queue.append((child, obj))
        for path, obj in raw:
            self.out[path] = self._describe(obj)

    @staticmethod
    def _identity(obj: Any) -> Any:
        ident = obj.id.id
        return ident if isinstance(ident, str) else obj.id  # h5pyd: the HSDS id

    def _describe(self, obj: Any) -> Any:
        attrs = {name: self._value(obj.attrs[name]) for name in obj.attrs
                 if name != LEFT_OUT}
        if "REFERENCE_LIST" in attrs:  # the datasets a scale serves, in no set order
            attrs["REFERENCE_LIST"][2].sort(key=repr)
        kind = type(obj).__name__
        if kind == "Group":
            return ["group", attrs]
        if kind == "Datatype":
            return ["datatype", _canon_dtype(obj.dtype), attrs]
        shape = obj.shape
        dtype = _canon_dtype(obj.dtype)
        try:
            value = None if shape is None else self._value(obj[()])
        except (UnicodeError, ValueError, TypeError) as exc:  # h5pyd's own faults
            value = ["unreadable", type(exc).__name__]
        fill = None if shape is None else self._value(obj.fillvalue)
        if self.hsds and dtype == ["str", "ascii", 48] and value is not None and \
                all(v == "" or v[0] == "ref" for v in value[2]):
            dtype, fill = ["ref"], None
        if not _fixed(obj.dtype):
            fill = None  # a variable-length fill is 0, None or "" as the library likes
        return ["dataset", shape, dtype, fill, value, attrs]

    def _value(self, value: Any) -> Any:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "surrogateescape")
        if isinstance(value, str):
            return ["ref", self.first[value]] if self.hsds and value in self.first else value
        if isinstance(value, np.ndarray):
            return ["array", list(value.shape), self._value(value.reshape(-1).tolist())]
        if isinstance(value, np.generic):
            return self._value(value.tolist())
        if isinstance(value, list | tuple):
            return [self._value(v) for v in value]
        if type(value).__name__ in ("Reference", "RegionReference"):
            if not value:
                return ["ref", None]
            return ["ref", self.first.get(self._identity(self.f[value]), "unreached")]
        if isinstance(value, np.void):
            return [self._value(v) for v in value.tolist()]
        if type(value).__name__ == "Empty":  # h5py's and h5pyd's own classes
            return ["empty", _canon_dtype(value.dtype)]
        return value


def _left_out(view: h5py.File) -> set[str]:
    lines = view.attrs.get(LEFT_OUT)
    if lines is None:
        return set()
    return {str(line).split(":", 1)[0] for line in np.atleast_1d(lines)}


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("domain", DOMAINS)
def test_view_reads_as_h5pyd(mnt: Path, hsds_reader: HsdsServer, hsds_bucket: HsdsBucket,
                             domain: str) -> None:
    import h5pyd  # noqa: PLC0415

    with h5pyd.File("/" + domain, "r", endpoint=hsds_reader.endpoint, username="admin",
                    password="admin") as remote:
        want = _Walk(remote, hsds=True).out
    with h5py.File(_view(mnt, domain), "r") as view:
        got = _Walk(view).out
        left_out = _left_out(view)
    assert left_out == EXPECTED_LEFT_OUT.get(domain, set()) | NOTED.get(domain, set())
    for path in left_out - NOTED.get(domain, set()):
        assert want.pop(path)[0] == "external"
    faults = {path for (d, path) in H5PYD_FAULTS if d == domain}
    assert {path for path, entry in want.items()
            if entry[0] == "dataset" and isinstance(entry[4], list)
            and entry[4][:1] == ["unreadable"]} <= faults
    if faults:
        import hdf5plugin  # noqa: F401, PLC0415  (the loaded files use Blosc)

        with h5py.File(hsds_bucket.files[domain], "r") as original:
            loaded = _Walk(original).out
        for path in faults:
            want[path][4] = loaded[path][4]
    assert sorted(got) == sorted(want)
    for path, expected in want.items():
        np.testing.assert_equal(got[path], expected, err_msg=f"{domain}:{path}")


def digests(path: str) -> dict[str, str]:
    """Every dataset of the HDF5 file ``path`` with its elements: shape, dtype,
    maxshape and a digest of its bytes, by name, and each external link with
    the file it names and what it leads to (run in other namespaces too)."""
    out: dict[str, str] = {}

    def digest(obj: Any) -> str:
        if not (isinstance(obj, h5py.Dataset) and obj.shape and _fixed(obj.dtype)):
            return type(obj).__name__
        data = np.ascontiguousarray(obj[()])
        return (f"{obj.shape} {obj.dtype.str} {obj.maxshape} "
                f"{hashlib.sha256(data.tobytes()).hexdigest()}")

    with h5py.File(path, "r") as f:
        def add(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                out[name] = digest(obj)

        def external(name: str, link: Any) -> None:
            if isinstance(link, h5py.ExternalLink):
                out[f"{name} -> {link.filename}"] = digest(f[name])
        f.visititems(add)
        f.visititems_links(external)
    return out


def test_external_links_lead_to_views_wherever_the_mount_is(mnt: Path) -> None:
    """An external link into another domain of the mount names that domain's
    view by a path relative to the view's own directory (so a copy of both,
    or the mount at another path, still resolves it; the bind-mount test
    reads them there) and reads as the target does."""
    view = _view(mnt, "home/admin/links.h5")
    found = {name: value for name, value in digests(str(view)).items() if " -> " in name}
    assert len(found) == 2, found
    for name, value in found.items():
        filename = name.split(" -> ", 1)[1]
        assert not filename.startswith("/"), name
        target = (view.parent / filename).resolve()
        assert target.is_file() and target.name.endswith(".h5.h5"), name
        if name.startswith("ext_data"):
            assert value == digests(str(target))["data"], name
        else:
            assert name.startswith("ext_group") and value == "Group", name


def test_elements_are_inside_the_file(mnt: Path) -> None:
    """No dataset of any view names another file: the elements of every
    fixed-size dataset are inside the view, and equal its ``.npy`` here."""
    checked = 0
    for domain in DOMAINS:
        with h5py.File(_view(mnt, domain), "r") as view:
            def check(name: str, obj: Any, domain: str = domain) -> None:
                nonlocal checked
                if not isinstance(obj, h5py.Dataset):
                    return
                assert not obj.external, (domain, name)
                npy = mnt / domain / f"{name}.npy"
                if obj.shape and _fixed(obj.dtype) and npy.is_file():
                    np.testing.assert_array_equal(obj[()], np.load(npy), err_msg=name)
                    checked += 1
            view.visititems(check)
    assert checked > 50


def test_a_copy_reads_the_same_once_the_mount_is_gone(hsds_bucket: HsdsBucket,
                                                      tmp_path: Path) -> None:
    """``cp`` and ``tar`` of the views, read with h5py after the unmount, equal
    the views read on the mount, object by object."""
    copies, archive = tmp_path / "copies", tmp_path / "views.tar"
    copies.mkdir()
    want = {}
    with mounted(hsds_bucket.bucket_dir, tmp_path / "mnt") as mp:
        for domain in DOMAINS:
            with h5py.File(_view(mp, domain), "r") as view:
                want[domain] = _Walk(view).out
            subprocess.run(["cp", str(_view(mp, domain)), str(copies / f"{len(want)}.h5")],
                           check=True)
        subprocess.run(["tar", "-cf", str(archive), "-C", str(mp / "home/admin"),
                        *(Path(d).name + ".h5" for d in DOMAINS)], check=True)
    untarred = tmp_path / "untar"
    untarred.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(untarred)], check=True)
    for number, domain in enumerate(DOMAINS, 1):
        for copy in (copies / f"{number}.h5", untarred / (Path(domain).name + ".h5")):
            with h5py.File(copy, "r") as f:
                got = _Walk(f).out
            assert sorted(got) == sorted(want[domain]), copy
            for path, expected in want[domain].items():
                np.testing.assert_equal(got[path], expected, err_msg=f"{copy}:{path}")


def test_views_read_the_same_through_a_bind_mount(mnt: Path, tmp_path: Path) -> None:
    """The mount seen at another path, as in a container: in a private mount
    namespace the mountpoint is bind-mounted elsewhere and its own path
    unmounted; every view read there equals the view read here."""
    other = tmp_path / "other"
    other.mkdir()
    views = [str(_view(other, domain)) for domain in DOMAINS]
    script = ('mount --bind "$1" "$2" && umount -l "$1" && shift 2 && '
              'exec "$@"')
    reader = ("import json, sys; from tests.test_h5view import digests; "
              "print(json.dumps({p: digests(p) for p in sys.argv[1:]}))")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           "sh", str(mnt), str(other), sys.executable, "-c", reader, *views],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    there = json.loads(done.stdout)
    for domain, path in zip(DOMAINS, views, strict=True):
        here = digests(str(_view(mnt, domain)))
        assert there[path] == here, domain
    assert sum(len(d) for d in there.values()) > 50


def test_every_view_opens_in_hdf5_tools(mnt: Path) -> None:
    h5dump, h5ls = _tool("h5dump"), _tool("h5ls")
    for domain in DOMAINS:
        view = _view(mnt, domain)
        dumped = subprocess.run([h5dump, str(view)], check=False, capture_output=True,
                                text=True, errors="replace", timeout=120)
        assert dumped.returncode == 0 and not dumped.stderr, (domain, dumped.stderr[-2000:])
        assert "DATASET" in dumped.stdout
        listed = subprocess.run([h5ls, "-r", str(view)], check=False, capture_output=True,
                                text=True, errors="replace", timeout=120)
        assert listed.returncode == 0 and not listed.stderr, (domain, listed.stderr[-2000:])


@dataclass
class _Diff:
    """What ``h5diff -v`` says of two files."""

    only_first: set[str] = field(default_factory=set)
    only_second: set[str] = field(default_factory=set)
    #: Objects (``dataset: </a> and </a>`` headers) with differences found.
    different: set[str] = field(default_factory=set)
    #: Objects with a "different maximum dimensions" warning.
    maxdims: set[str] = field(default_factory=set)
    not_comparable: set[str] = field(default_factory=set)


_TABLE_ROW = re.compile(r"^    (x| )      (x| )    (/.*?)\s*$")
_HEADER = re.compile(r"^(\w[\w ]*): <(.*?)> and <")
_FOUND = re.compile(r"^(\d+) differences? found")


def _h5diff(first: Path, second: Path, env: dict[str, str]) -> _Diff:
    done = subprocess.run([_tool("h5diff"), "-v", str(first), str(second)], check=False,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode in (0, 1) and not done.stderr, (first, done.stderr)
    diff, current = _Diff(), ""
    for line in done.stdout.splitlines():
        if row := _TABLE_ROW.match(line):
            if row[2] == " ":
                diff.only_first.add(row[3])
            elif row[1] == " ":
                diff.only_second.add(row[3])
        elif header := _HEADER.match(line):
            current = f"{header[1]} {header[2]}"
        elif (found := _FOUND.match(line)) and int(found[1]) and current:
            diff.different.add(current)
        elif line.startswith("Warning: different maximum dimensions"):
            diff.maxdims.add(current)
        elif line.startswith("Not comparable:") and not line.endswith("is an empty dataset"):
            diff.not_comparable.add(line)
    return diff


def test_h5diff_finds_the_loaded_file(mnt: Path, hsds_bucket: HsdsBucket) -> None:
    """``h5diff -v`` of each view against the file hsloaded into it: every
    object of both, no difference but those HSDS made (and the left-out
    external links). The originals use Blosc, which Debian's HDF5 reads
    through the plugins hdf5plugin ships."""
    import hdf5plugin  # noqa: PLC0415

    env = {**os.environ, "HDF5_PLUGIN_PATH": hdf5plugin.PLUGINS_PATH}
    for domain, source in hsds_bucket.domains():
        diff = _h5diff(source, _view(mnt, domain), env)
        assert diff.only_first == EXPECTED_LEFT_OUT.get(domain, set()), domain
        assert diff.only_second == set(), domain
        assert diff.different == H5DIFF_EXPECTED.get(domain, set()), domain
        assert diff.maxdims == H5DIFF_MAXDIMS.get(domain, set()), domain
        assert diff.not_comparable == H5DIFF_NOT_COMPARABLE.get(domain, set()), domain


def test_view_size_is_exact_for_cp_and_tar(mnt: Path, tmp_path: Path) -> None:
    """``cp`` and ``tar`` trust ``st_size``: they copy every byte of each view."""
    for domain in DOMAINS:
        view = _view(mnt, domain)
        data = view.read_bytes()
        assert view.stat().st_size == len(data)
        assert view.name in os.listdir(view.parent)
        copy = tmp_path / "copy.h5"
        subprocess.run(["cp", str(view), str(copy)], check=True)
        assert copy.read_bytes() == data
    archive = tmp_path / "views.tar"
    subprocess.run(["tar", "-cf", str(archive), "-C", str(mnt / "home/admin"),
                    *(Path(d).name + ".h5" for d in DOMAINS)], check=True)
    out = tmp_path / "untar"
    out.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(out)], check=True)
    for domain in DOMAINS:
        assert (out / (Path(domain).name + ".h5")).read_bytes() == _view(mnt, domain).read_bytes()


def test_inline_cap_leaves_out_and_says_why(hsds_bucket: HsdsBucket, tmp_path: Path) -> None:
    """Past ``-o h5view_inline`` variable-length datasets are left out, each named
    in the root attribute; the rest of the file still reads."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mounted(hsds_bucket.bucket_dir, mp, "-o", "h5view_inline=64"), \
            h5py.File(mp / "home/admin/types.h5.h5", "r") as view:
        lines = [str(line) for line in view.attrs[LEFT_OUT]]
        assert any(line.startswith("/strings/") and "h5view_inline=64" in line
                   for line in lines), lines
        for line in lines:
            assert line.split(":", 1)[0] not in view
        assert view["misc/enum"][()].tolist() == [0, 1, 42, 1]


def _objects(view: h5py.File) -> dict[str, Any]:
    """Every object of the file below the root, by the path ``visititems`` gives."""
    found: dict[str, Any] = {}

    def visit(name: str, obj: Any) -> None:
        found[name] = obj

    view.visititems(visit)
    return found


def test_object_cap_keeps_the_first_objects_and_says_so(mnt: Path, hsds_bucket: HsdsBucket,
                                                        tmp_path: Path) -> None:
    """Past ``-o h5view_objects`` a file holds the objects found first (breadth
    first) and names the limit; what it holds reads as in the full file."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mounted(hsds_bucket.bucket_dir, mp, "-o", "h5view_objects=6"), \
            h5py.File(mp / "home/admin/layout.h5.h5", "r") as view, \
            h5py.File(_view(mnt, "home/admin/layout.h5"), "r") as full:
        kept, everything = _objects(view), _objects(full)
        assert len(everything) > 6
        assert len(kept) == 5  # and the root group
        lines = [str(line) for line in view.attrs[LEFT_OUT]]
        assert any(line.startswith("/: ") and "h5view_objects=6" in line for line in lines)
        for name, obj in kept.items():
            assert name in everything
            if isinstance(obj, h5py.Dataset):
                np.testing.assert_array_equal(obj[()], full[name][()])


def test_view_off(hsds_bucket: HsdsBucket, tmp_path: Path) -> None:
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mounted(hsds_bucket.bucket_dir, mp, "-o", "h5view=off"):
        names = os.listdir(mp / "home/admin")
        assert "types.h5" in names and "types.h5.json" in names
        assert not [n for n in names if n.endswith(".h5.h5")]
        assert not (mp / "home/admin/types.h5.h5").exists()
