"""A real FUSE mount of a bucket written by a real HSDS, compared with h5py."""

from __future__ import annotations

import json
import os
import posixpath
import stat
import subprocess
from pathlib import Path

import h5py
import numcodecs
import numpy as np
import pytest

from tests.h5compare import (
    LinkInfo,
    descr_fields,
    expected_chunk,
    expected_json,
    h5_normpath,
    json_float,
    mount_file,
    mount_rel,
    symlinks_leaving,
    walk_links,
)
from tests.mounting import fuse_available

pytestmark = [pytest.mark.mount, pytest.mark.hsds, pytest.mark.skipif(fuse_available() is not None,
                                                 reason=f"no FUSE: {fuse_available()}")]


def sidecar_dtype(doc: dict) -> np.dtype | str:
    dt = doc["dtype"]
    if isinstance(dt, str) and dt.startswith("vlen"):
        return dt
    if isinstance(dt, dict):
        return "vlen"
    if isinstance(dt, list):
        if any(not isinstance(field[1], str | list) or str(field[1]).startswith("vlen")
               for field in dt):
            return "json2"
        return np.dtype(descr_fields(dt))
    return np.dtype(dt)


def check_dataset(ds: h5py.Dataset, where: Path, side: Path, f: h5py.File) -> None:
    doc = json.loads(side.read_text())
    assert doc["kind"] == "dataset"
    assert doc["path"] == ds.name or doc["id"]
    assert doc["shape"] == (None if ds.shape is None else list(ds.shape)), where
    dtype = sidecar_dtype(doc)
    if h5py.check_ref_dtype(ds.dtype):
        check_references(ds, where, doc, f)
        return
    if isinstance(dtype, np.dtype):
        assert dtype == ds.dtype or dtype.descr == ds.dtype.descr, (where, dtype, ds.dtype)
        assert doc["fill_value"] == expected_json(np.asarray(ds.fillvalue, dtype=dtype)[()], f), \
            (where, doc["fill_value"], ds.fillvalue)
    elif h5py.check_string_dtype(ds.dtype) and h5py.check_string_dtype(ds.dtype).length is None:
        assert dtype == "vlen-utf8", where
    chunks = doc["chunks"]
    stored = sorted(n for n in os.listdir(where) if not n.startswith("."))
    grid = [-(-n // c) for n, c in zip(ds.shape or (), chunks, strict=False)]
    for name in stored:
        index = tuple(int(i) for i in name.split("."))
        data = (where / name).read_bytes()
        if isinstance(dtype, np.dtype):
            size = int(np.prod(chunks)) * dtype.itemsize
            assert os.stat(where / name).st_size == len(data) == size, (where, name)
            expected = expected_chunk(ds, index, chunks, dtype)
            actual = np.frombuffer(data, dtype=dtype).reshape(expected.shape)
            if dtype.names is None and dtype.kind == "f":
                np.testing.assert_array_equal(actual, expected, err_msg=f"{where}/{name}")
            else:
                assert actual.tobytes() == expected.astype(dtype).tobytes(), (where, name)
        elif dtype == "vlen-utf8":
            expected = expected_chunk(ds, index, chunks, np.dtype(object))
            actual = numcodecs.VLenUTF8().decode(data)
            assert list(actual) == [s or "" for s in expected.reshape(-1)], (where, name)
    if ds.shape and ds.size and isinstance(dtype, np.dtype) and dtype.kind in "iuf":
        # chunks that are not listed must hold only the fill value in HDF5
        listed = {tuple(int(i) for i in n.split(".")) for n in stored}
        for index in np.ndindex(*grid):
            if index not in listed:
                block = expected_chunk(ds, index, chunks, dtype)
                full = np.full(block.shape, ds.fillvalue, dtype=dtype)
                np.testing.assert_array_equal(block, full, err_msg=f"{where} {index}")
    if ds.shape == ():
        assert "value" in doc
        value = ds[()]
        if isinstance(value, bytes):
            value = value.decode()
        if isinstance(value, np.floating | float):
            value = json_float(float(value))
        if isinstance(value, np.generic):
            value = value.item()
        assert doc["value"] == value, where


def check_references(ds: h5py.Dataset, where: Path, doc: dict, f: h5py.File) -> None:
    """Reference chunks hold the target ids (``|S48``), as HSDS stores them."""
    assert doc["dtype"] == "|S48"
    root = where.parents[len(ds.name.strip("/").split("/")) - 1]
    (name,) = [n for n in os.listdir(where) if not n.startswith(".")]
    ids = np.frombuffer((where / name).read_bytes(), dtype="S48")
    for ref, obj_id in zip(ds[()], ids, strict=False):
        target = f[ref].name
        side = root / mount_file(target, ".json") if target != "/" else \
            root.parent / f"{root.name}.json"
        assert json.loads(side.read_text())["id"] == obj_id.decode(), (where, target)


def check_attributes(obj, where: Path, side: Path, f: h5py.File) -> None:
    doc = json.loads(side.read_text())
    attrs = doc["attributes"]
    assert set(attrs) == set(obj.attrs), where
    for name in obj.attrs:
        value = obj.attrs[name]
        expected = expected_json(value, f)
        assert attrs[name] == expected, (where, name, attrs[name], expected)
        xattr = os.getxattr(where, f"user.h5.attr.{name}")
        if isinstance(expected, str):
            assert xattr.decode() == expected
        else:
            assert json.loads(xattr) == expected


def test_every_link_matches_h5py(mnt: Path, hsds_bucket) -> None:
    checked = 0
    for domain, h5file in hsds_bucket.domains():
        root = mnt / domain
        with h5py.File(h5file, "r") as f:
            for info in walk_links(f):
                where = root / mount_rel(info.path)
                check_link(info, where, root, f)
                checked += 1
    assert checked > 100


def check_link(info: LinkInfo, where: Path, root: Path, f: h5py.File) -> None:
    link = info.link
    side = root / mount_file(info.path, ".json")
    if isinstance(link, h5py.SoftLink):
        assert where.is_symlink(), where
        target = f.get(link.path) if ".." not in link.path.split("/") else None
        if target is None:
            # dangling: where the target would be, normalised, relative, inside the domain
            text = os.readlink(where)
            parent = posixpath.dirname(info.path)
            lexical = posixpath.normpath(posixpath.join(str(where.parent), text))
            assert not text.startswith("/")
            assert lexical == str(root / mount_rel(h5_normpath(link.path, parent))), text
        else:
            resolved = (where.parent / os.readlink(where)).resolve()
            assert resolved == (root / mount_rel(link.path)).resolve(), where
            assert side.is_symlink()
            assert json.loads(side.read_text())["kind"] in ("group", "dataset")
        return
    if isinstance(link, h5py.ExternalLink):
        assert where.is_symlink(), where
        text = os.readlink(where)
        assert not text.startswith("/"), text
        if "::" in text:  # dangling: it cannot climb
            assert ".." not in text.split("/") and text.endswith(f"::{link.path}"), text
        else:
            assert (where.parent / text).exists(), text
        return
    if info.cycle_to is not None:
        assert where.is_symlink(), where
        resolved = (where.parent / os.readlink(where)).resolve()
        assert resolved == (root / mount_rel(info.cycle_to)).resolve()
        return
    st = os.lstat(where)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o555, where
    assert st.st_uid == os.getuid() and st.st_gid == os.getgid()
    parent, name = info.path.rsplit("/", 1)
    if f"{name}.json" in f[parent or "/"]:
        # a real link of that name wins over the generated sidecar (tested elsewhere)
        return
    side_st = os.stat(side)
    assert stat.S_IMODE(side_st.st_mode) == 0o444
    assert side_st.st_size == len(side.read_bytes())
    doc = json.loads(side.read_text())
    assert os.getxattr(where, "user.h5.id").decode() == doc["id"]
    assert os.getxattr(where, "user.h5.kind").decode() == doc["kind"]
    if isinstance(info.obj, h5py.Dataset):
        check_dataset(info.obj, where, side, f)
    elif isinstance(info.obj, h5py.Group):
        assert doc["kind"] == "group"
    check_attributes(info.obj, where, side, f)


def test_no_symlink_leaves_the_mount(mnt: Path) -> None:
    """Hostile soft and external links (``/../../etc/passwd``, a domain
    ``/etc/passwd``) are symlinks that stay inside; reading through them
    never reaches the host's files; the raw links are in the parent's sidecar."""
    seen, bad = symlinks_leaving(mnt)
    assert seen > 10 and not bad, bad
    domain = "home/admin/links.h5"
    root = mnt / domain
    for rel in ("escape_abs", "g1/escape_rel", "escape_ext", "escape_ext_rel"):
        where = root / rel
        assert where.is_symlink() and not where.exists(), os.readlink(where)
        with pytest.raises(FileNotFoundError):
            where.read_bytes()
    links = json.loads((mnt / f"{domain}.json").read_text())["links"]
    assert links["escape_abs"] == {"kind": "soft", "path": "/../../../../../../../../etc/passwd"}
    assert links["escape_ext"]["kind"] == "external"
    assert links["escape_ext"]["domain"].endswith("/etc/passwd")
    copied = subprocess.run(["cp", "-rL", str(root / "escape_abs"), "/dev/null"],
                            check=False, capture_output=True, text=True)
    assert copied.returncode != 0 and "No such file" in copied.stderr


def test_domain_root_sidecar(mnt: Path, hsds_bucket) -> None:
    for domain, h5file in hsds_bucket.domains():
        doc = json.loads((mnt / f"{domain}.json").read_text())
        assert doc["kind"] == "group" and doc["path"] == "/"
        assert set(doc["domain"]) >= {"owner", "acls", "created", "lastModified"}
        with h5py.File(h5file, "r") as f:
            assert set(doc["attributes"]) == set(f.attrs)
            for name in f.attrs:
                assert doc["attributes"][name] == expected_json(f.attrs[name], f)
        # The domain's times are the storage time of its JSON (HSDS writes the
        # file a moment after the lastModified it puts inside).
        st = os.stat(mnt / domain)
        stored = os.stat(hsds_bucket.bucket_dir / domain / ".domain.json")
        assert abs(st.st_mtime - stored.st_mtime) < 1e-6
        assert abs(st.st_mtime - doc["domain"]["lastModified"]) < 5


def test_hard_links_share_object(mnt: Path) -> None:
    root = mnt / "home/admin/links.h5"
    a = json.loads((root / "g1/g2/d.json").read_text())
    b = json.loads((root / "g1/hard_alias.json").read_text())
    assert a["id"] == b["id"] and a["path"] != b["path"]
    assert os.listdir(root / "g1/g2/d") == os.listdir(root / "g1/hard_alias")
    assert (root / "g1/g2/d/0").read_bytes() == (root / "g1/hard_alias/0").read_bytes()


def test_names_are_escaped(mnt: Path) -> None:
    names = set(os.listdir(mnt / "home/admin/links.h5/names"))
    assert "percent%2541name" in names and "with%252Fslash_escape" in names
    long = [n for n in names if "~" in n and n.startswith("long_")]
    assert len(long) == 3 and all(len(n.encode()) <= 255 for n in long)  # P, P.json, P.npy
    # real links win over generated sidecar names
    assert (mnt / "home/admin/links.h5/names/x.json").is_dir()
    assert json.loads((mnt / "home/admin/links.h5/names/x.json.json").read_text())["kind"] \
        == "dataset"
    assert (mnt / "home/admin/links.h5/names/y.json").is_dir()


def test_directories_ask_for_small_getdents_buffers(mnt: Path) -> None:
    """glibc sizes a directory stream's buffer, and so each getdents64 and the
    kernel's buffer for each FUSE readdir, by the directory's st_blksize: a
    directory must not ask for 1 MiB per readdir, while files keep the large
    I/O size that cp and other copiers read with."""
    domain = mnt / "home/admin/types.h5"
    for path in (mnt, domain, domain / "misc"):
        assert os.stat(path).st_blksize <= 32768, path
    assert os.lstat(mnt / "home/admin/types.h5/misc/refs.json").st_blksize == 1 << 20
    (entry,) = [e for e in os.scandir(domain) if e.name == "misc"]
    assert entry.stat().st_blksize <= 32768


def test_find_and_tools(mnt: Path) -> None:
    found = subprocess.run(["find", str(mnt)], capture_output=True, text=True, timeout=120,
                           check=False)
    assert found.returncode == 0, found.stderr
    assert len(found.stdout.splitlines()) > 300
    jq = subprocess.run(["jq", ".", str(mnt / "home/admin/types.h5/misc/refs.json")],
                        capture_output=True, text=True, check=True)
    assert '"kind": "dataset"' in jq.stdout
    getfattr = subprocess.run(["getfattr", "-d", str(mnt / "home/admin/attrs.h5/dset")],
                              capture_output=True, text=True, check=True)
    assert 'user.h5.attr.units="m/s"' in getfattr.stdout
