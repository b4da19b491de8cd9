"""``layouts.formats.refs._table``: reference files (LINDI, kerchunk) read into a ``RefTable``.

``parse_refs`` is tested on hand-written JSON: every value form, templates,
kerchunk ``gen``, URL resolution and every refusal. ``load_reference`` is
tested on real lindi output: ``tests/lindi_tool.py`` runs lindi 0.4.6 in
``.venv-lindi`` (``write_lindi``) to write ``.lindi.json``, ``.lindi.tar`` and
``.lindi.d`` files of a small h5py file, and ``lindi_read`` asks lindi's own
reader for the bytes of each key, which must equal what the table gives
(inline bytes, or the byte range read from the file it names). Remote loading
goes through ``mountd.io.http`` against the loopback ``RangeHttpServer``.
"""

from __future__ import annotations

import base64
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import trio

from layouts.formats.refs._table import (
    BadRef,
    RangeRef,
    RefFormatError,
    RefTable,
    load_reference,
    parse_refs,
)
from layouts.storage import Store
from mountd.errors import NotFound
from mountd.io.local import LocalStore
from tests.lindi_files import lindi_read, write_lindi

LOCAL = LocalStore("/")


# ---------------------------------------------------------------- helpers

def local_open(uri: str) -> tuple[Store, str]:
    return LOCAL, uri.lstrip("/")


def load(path: Path | str, *, is_dir: bool = False,
         open_uri: Callable[[str], tuple[Store, str]] = local_open) -> RefTable:
    return trio.run(lambda: load_reference(str(path), open_uri, is_dir=is_dir))


def ref_bytes(ref: bytes | RangeRef) -> bytes:
    """The bytes a ref stands for; a RangeRef must name a local file."""
    if isinstance(ref, bytes):
        return ref
    assert ref.url.startswith("/"), ref
    with open(ref.url, "rb") as f:
        f.seek(ref.offset)
        return f.read() if ref.length is None else f.read(ref.length)


def parse(obj: Any, location: str = "/data/refs/x.json", remote: bool = False,
          **kwargs: Any) -> RefTable:
    return parse_refs(json.dumps(obj).encode(), location, remote, **kwargs)


def refuse(obj: Any, *needles: str, **kwargs: Any) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    with pytest.raises(RefFormatError) as caught:
        parse_refs(raw, kwargs.pop("location", "/data/refs/x.json"),
                   kwargs.pop("remote", False), **kwargs)
    message = str(caught.value)
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# ---------------------------------------------------------------- parse_refs: values

ZARRAY = {"chunks": [2], "compressor": None, "dtype": "<i4", "fill_value": 0,
          "filters": None, "order": "C", "shape": [4], "zarr_format": 2}


def test_v0_whole_object_is_refs() -> None:
    table = parse({".zgroup": '{"zarr_format": 2}', "x/.zarray": json.dumps(ZARRAY),
                   "x/0": ["/abs/f.h5", 10, 8], "x/1": ["/abs/f.h5"]})
    assert table.kind == "kerchunk"
    assert table.refs[".zgroup"] == b'{"zarr_format": 2}'
    assert json.loads(table.refs["x/.zarray"]) == ZARRAY
    assert table.refs["x/0"] == RangeRef("/abs/f.h5", 10, 8)
    assert table.refs["x/1"] == RangeRef("/abs/f.h5", 0, None)
    assert table.metadata == {}
    assert table.location == "/data/refs/x.json"
    assert table.remote is False


def test_v1_values_templates_and_metadata() -> None:
    binary = bytes(range(256))
    table = parse({
        "version": 1,
        "templates": {"u": "https://example.org/data/f.h5", "v": "other.h5"},
        "generationMetadata": {"generatedBy": "test"},
        "refs": {
            ".zattrs": {"a": [1, 2], "b": "x"},
            "x/.zarray": json.dumps(ZARRAY),
            "text": "héllo",
            "bin": "base64:" + base64.b64encode(binary).decode(),
            "x/0": ["{{u}}", 0, 100],
            "x/1": ["{{ u }}", 100, 100],
            "x/2": ["{{v}}", 5, 6],
            "x/3": ["{{u}}"],
            "empty": "",
        },
    })
    refs = table.refs
    assert table.kind == "lindi"
    assert table.metadata == {"generatedBy": "test"}
    assert refs[".zattrs"] == json.dumps({"a": [1, 2], "b": "x"}).encode()
    assert refs["x/.zarray"] == json.dumps(ZARRAY).encode()
    assert refs["text"] == "héllo".encode()
    assert refs["bin"] == binary
    assert refs["empty"] == b""
    assert refs["x/0"] == RangeRef("https://example.org/data/f.h5", 0, 100)
    assert refs["x/1"] == RangeRef("https://example.org/data/f.h5", 100, 100)
    assert refs["x/2"] == RangeRef("/data/refs/other.h5", 5, 6)
    assert refs["x/3"] == RangeRef("https://example.org/data/f.h5", 0, None)
    # one resolved URL string is shared by all refs naming it
    assert refs["x/0"].url is refs["x/1"].url


def test_refs_without_version_and_version_without_refs() -> None:
    assert parse({"refs": {"a": "1"}}).refs == {"a": b"1"}
    table = parse({"version": 1})
    assert table.refs == {}
    assert table.kind == "kerchunk"


def test_padding_bom_and_size() -> None:
    raw = b'\xef\xbb\xbf  {"refs": {"a": "b"}}' + b" " * 100 + b"\0" * 50
    table = parse_refs(raw, "/x/y.lindi.json", False, mtime=12.5)
    assert table.refs == {"a": b"b"}
    assert table.size == len(raw)
    assert table.mtime == 12.5
    assert table.kind == "lindi"  # by its name, lacking generationMetadata
    assert parse_refs(raw, "/x/y.json", False, size=7).size == 7


@pytest.mark.parametrize(("location", "hint", "expected"), [
    ("/x/refs.json", None, "kerchunk"),
    ("/x/refs.lindi.json", None, "lindi"),
    ("https://h/x/refs.lindi.json?sig=1", None, "lindi"),
    ("/x/refs.json", "lindi", "lindi"),
    ("/x/refs.lindi.json", "kerchunk", "kerchunk"),
])
def test_kind(location: str, hint: str | None, expected: str) -> None:
    table = parse({"refs": {}, "version": 1}, location, location.startswith("http"),
                  kind_hint=hint)
    assert table.kind == expected


def test_kind_hint_checks() -> None:
    with pytest.raises(ValueError, match="unknown reference kind"):
        parse({}, kind_hint="zarr")
    with pytest.raises(ValueError, match="members"):
        parse({}, kind_hint="lindi.tar")


# ---------------------------------------------------------------- parse_refs: URLs

@pytest.mark.parametrize(("url", "expected"), [
    ("http://h/a.h5", "http://h/a.h5"),
    ("https://h/a.h5?x=1", "https://h/a.h5?x=1"),
    ("HTTPS://h/A.h5", "https://h/A.h5"),
    ("s3://bucket/key.h5", "s3://bucket/key.h5"),
    ("/abs/./dir/../f.h5", "/abs/f.h5"),
    ("file:///abs/f.h5", "/abs/f.h5"),
    ("file://localhost/abs/f.h5", "/abs/f.h5"),
    ("FILE:///abs/f.h5", "/abs/f.h5"),
    ("file://rel/f.h5", "/data/refs/rel/f.h5"),
    ("f.h5", "/data/refs/f.h5"),
    ("./sub/f.h5", "/data/refs/sub/f.h5"),
    ("../f.h5", "/data/f.h5"),
])
def test_local_reference_urls(url: str, expected: str) -> None:
    table = parse({"refs": {"k": [url, 0, 1]}})
    assert table.refs["k"] == RangeRef(expected, 0, 1)
    assert table.resolve(url) == expected


@pytest.mark.parametrize(("url", "expected"), [
    ("https://other/a.h5", "https://other/a.h5"),
    ("f.h5", "https://h/data/f.h5"),
    ("./blobs/f.h5", "https://h/data/blobs/f.h5"),
    ("../f.h5", "https://h/f.h5"),
    ("/abs/f.h5", "/abs/f.h5"),
    ("file:///abs/f.h5", "/abs/f.h5"),
])
def test_remote_reference_urls(url: str, expected: str) -> None:
    """Relative URLs join the reference URL; local paths stay local, for the reader
    to refuse."""
    table = parse({"refs": {"k": [url, 0, 1]}}, "https://h/data/x.json?sig=abc", True)
    assert table.refs["k"] == RangeRef(expected, 0, 1)
    assert table.resolve(url) == expected
    assert table.location == "https://h/data/x.json?sig=abc"
    assert table.remote is True


def test_relative_location_is_made_absolute() -> None:
    table = parse({"refs": {"k": ["f.h5", 0, 1]}}, "rel/x.json")
    assert table.location == os.path.join(os.getcwd(), "rel", "x.json")
    assert table.refs["k"].url == os.path.join(os.getcwd(), "rel", "f.h5")


def test_directory_urls() -> None:
    local = parse({"refs": {"k": ["./blobs/a/0", 0, 4]}}, "/d/x.lindi.d", kind_hint="lindi.d")
    assert local.refs["k"] == RangeRef("/d/x.lindi.d/blobs/a/0", 0, 4)
    assert local.resolve("../f.h5") == "/d/f.h5"
    remote = parse({"refs": {"k": ["./blobs/a/0", 0, 4]}}, "https://h/d/x.lindi.d/", True,
                   kind_hint="lindi.d")
    assert remote.location == "https://h/d/x.lindi.d"
    assert remote.refs["k"] == RangeRef("https://h/d/x.lindi.d/blobs/a/0", 0, 4)
    assert remote.resolve("f.h5") == "https://h/d/x.lindi.d/f.h5"


def test_tar_members() -> None:
    members = {"blobs/a/0": (2048, 100), "lindi.json": (1024, 512)}
    table = parse({"refs": {
        "k0": ["./blobs/a/0", 0, 100],
        "k1": ["blobs/a/0", 10, 20],
        "k2": ["./blobs/a/0"],
        "k3": ["{{t}}", 90, 10],
        "k4": ["./next.h5", 5, 5],
        "k5": ["/abs/blobs/a/0", 0, 1],
    }, "templates": {"t": "./blobs/a/0"}}, "/d/x.lindi.tar", kind_hint="lindi.tar",
        members=members)
    refs = table.refs
    assert refs["k0"] == RangeRef("/d/x.lindi.tar", 2048, 100)
    assert refs["k1"] == RangeRef("/d/x.lindi.tar", 2058, 20)
    assert refs["k2"] == RangeRef("/d/x.lindi.tar", 2048, 100)
    assert refs["k3"] == RangeRef("/d/x.lindi.tar", 2138, 10)
    assert refs["k4"] == RangeRef("/d/next.h5", 5, 5)
    assert refs["k5"] == RangeRef("/abs/blobs/a/0", 0, 1)
    assert table.kind == "lindi.tar"
    assert table.resolve("./next.h5") == "/d/next.h5"
    bad = parse({"refs": {"bad": ["./blobs/a/0", 50, 51]}}, "/d/x.lindi.tar",
                kind_hint="lindi.tar", members=members).refs["bad"]
    assert isinstance(bad, BadRef) and "refs['bad']" in bad.problem
    assert "past the end" in bad.problem


@pytest.mark.slow
def test_many_refs_share_urls() -> None:
    refs = {f"x/{i}": ["{{u}}" if i % 2 else "data/f.h5", i * 10, 10] for i in range(100_000)}
    table = parse({"refs": refs, "templates": {"u": "https://h/f.h5"}})
    assert len(table.refs) == 100_000
    assert table.refs["x/99999"] == RangeRef("https://h/f.h5", 999_990, 10)
    assert table.refs["x/4"] == RangeRef("/data/refs/data/f.h5", 40, 10)
    assert len({id(r.url) for r in table.refs.values()}) == 2


# ---------------------------------------------------------------- parse_refs: kerchunk gen

def test_gen_spec_example() -> None:
    """The example of the kerchunk spec, without its jinja function call."""
    table = parse({
        "version": 1,
        "templates": {"u": "server.domain/path"},
        "gen": [{"key": "gen_key{{i}}", "url": "http://{{u}}_{{i}}",
                 "offset": "{{(i + 1) * 1000}}", "length": "1000",
                 "dimensions": {"i": {"stop": 5}}}],
        "refs": {"key0": "data", "key1": ["http://target_url", 10000, 100],
                 "key2": ["http://{{u}}", 10000, 100]},
    })
    assert table.kind == "kerchunk"
    assert table.refs["key0"] == b"data"
    assert table.refs["key2"] == RangeRef("http://server.domain/path", 10000, 100)
    for i in range(5):
        assert table.refs[f"gen_key{i}"] == RangeRef(f"http://server.domain/path_{i}",
                                                     (i + 1) * 1000, 1000)
    assert len(table.refs) == 8


def test_gen_product_lists_and_whole_files() -> None:
    table = parse({"version": 1, "gen": [
        {"key": "x/{{i}}.{{j}}", "url": "f{{i}}_{{j}}.bin",
         "dimensions": {"i": [3, 1], "j": {"start": 4, "stop": 0, "step": -2}}},
        {"key": "y/{{ n // 2 }}", "url": "https://h/y", "offset": "{{ n % 2 * 8 - -1 }}",
         "length": 8, "dimensions": {"n": {"stop": 2}}},
    ]})
    assert {k: v for k, v in table.refs.items() if k.startswith("x/")} == {
        f"x/{i}.{j}": RangeRef(f"/data/refs/f{i}_{j}.bin", 0, None)
        for i in (3, 1) for j in (4, 2)}
    assert table.refs["y/0"] == RangeRef("https://h/y", 9, 8)


@pytest.mark.parametrize(("gen", "needles"), [
    ("x", ["gen: must be a list"]),
    ([1], ["gen[0]: must be an object"]),
    ([{"url": "u", "dimensions": {"i": [1]}}], ["gen[0].key"]),
    ([{"key": "k", "url": 3, "dimensions": {"i": [1]}}], ["gen[0].url"]),
    ([{"key": "k", "url": "u", "offset": "1", "dimensions": {"i": [1]}}], ["together"]),
    ([{"key": "k", "url": "u"}], ["gen[0].dimensions"]),
    ([{"key": "k", "url": "u", "dimensions": {"i": {"stop": 2, "step": 0}}}],
     ["gen[0].dimensions['i']"]),
    ([{"key": "k", "url": "u", "dimensions": {"i": ["a"]}}], ["gen[0].dimensions['i']"]),
    ([{"key": "k", "url": "u", "dimensions": {"i": 5}}], ["gen[0].dimensions['i']"]),
    ([{"key": "k{{i}}", "url": "u", "offset": "{{i * 1.5}}", "length": "1",
       "dimensions": {"i": [1]}}], ["gen[0].offset", "unsupported jinja"]),
    ([{"key": "k{{i|string}}", "url": "u", "dimensions": {"i": [1]}}],
     ["gen[0].key", "unsupported jinja"]),
    ([{"key": "k{{i}}", "url": "u", "offset": "{{i - 2}}", "length": "1",
       "dimensions": {"i": [1]}}], ["gen[0].offset", "negative"]),
    ([{"key": "k{{i}}", "url": "u", "offset": "{{i // 0}}", "length": "1",
       "dimensions": {"i": [1]}}], ["division by zero"]),
    ([{"key": "k{{i}}", "url": "{{u + 1}}", "dimensions": {"i": [1]}}],
     ["gen[0].url", "arithmetic on a string"]),
    ([{"key": "k{{i}}", "url": "{{w}}", "dimensions": {"i": [1]}}],
     ["gen[0].url", "unknown template 'w'"]),
    ([{"key": "k{{i}}", "url": "u", "offset": "x", "length": "1",
       "dimensions": {"i": [1]}}], ["gen[0].offset", "not an integer"]),
    ([{"key": "k{{i}}", "url": "u", "offset": "{{" + "+".join(["i"] * 50_000) + "}}",
       "length": "1", "dimensions": {"i": [1]}}], ["gen[0].offset"]),
    ([{"key": "k{{i}}", "url": "u", "offset": "{{i * 4294967296 * 4294967296}}",
       "length": "1", "dimensions": {"i": [1]}}], ["gen[0].offset", "out of range"]),
    ([{"key": "k{{i}}{{j}}", "url": "u",
       "dimensions": {"i": {"stop": 10**4}, "j": {"stop": 10**4}}}], ["expands to"]),
])
def test_gen_refused(gen: Any, needles: list[str]) -> None:
    refuse({"version": 1, "templates": {"u": "s"}, "gen": gen}, *needles)


# ---------------------------------------------------------------- parse_refs: refusals

@pytest.mark.parametrize(("obj", "needles"), [
    ({"refs": []}, ["refs: must be an object"]),
    ({"refs": {}, "templates": ["u"]}, ["templates: must be an object"]),
    ({"refs": {}, "templates": {"u": 1}}, ["templates['u']"]),
    ({"refs": {}, "version": 2}, ["version"]),
    ({"refs": {}, "version": "1"}, ["version"]),
    ({"refs": {}, "generationMetadata": [1]}, ["generationMetadata"]),
])
def test_refused(obj: Any, needles: list[str]) -> None:
    message = refuse(obj, *needles)
    assert message.startswith("/data/refs/x.json: ")


@pytest.mark.parametrize(("obj", "needles"), [
    ({"refs": {"k": 5}}, ["refs['k']", "a number"]),
    ({"refs": {"k": None}}, ["refs['k']", "null"]),
    ({"refs": {"k": True}}, ["refs['k']", "boolean"]),
    ({"refs": {"k": []}}, ["refs['k']", "[url]"]),
    ({"refs": {"k": ["u", 1]}}, ["refs['k']", "[url]"]),
    ({"refs": {"k": ["u", 1, 2, 3]}}, ["refs['k']", "[url]"]),
    ({"refs": {"k": [5, 1, 2]}}, ["refs['k']", "URL must be a string"]),
    ({"refs": {"k": [None]}}, ["refs['k']", "URL must be a string"]),
    ({"refs": {"k": ["u", -1, 2]}}, ["refs['k']", "offset"]),
    ({"refs": {"k": ["u", 1, -2]}}, ["refs['k']", "length"]),
    ({"refs": {"k": ["u", 1.0, 2]}}, ["refs['k']", "offset"]),
    ({"refs": {"k": ["u", True, 2]}}, ["refs['k']", "offset"]),
    ({"refs": {"k": ["u", 0, "2"]}}, ["refs['k']", "length"]),
    ({"refs": {"k": ["", 0, 2]}}, ["refs['k']", "empty URL"]),
    ({"refs": {"k": ["file://", 0, 2]}}, ["refs['k']", "file://"]),
    ({"refs": {"k": "base64:a"}}, ["refs['k']", "bad string"]),
    ({"refs": {"k": "base64:é"}}, ["refs['k']", "bad string"]),
    ({"refs": {"k": "\ud800"}}, ["refs['k']", "bad string"]),
    ({"refs": {"k": ["{{v}}", 0, 1]}, "templates": {"u": "x"}},
     ["refs['k']", "unknown template 'v'"]),
    ({"refs": {"k": ["{{v}}", 0, 1]}}, ["refs['k']", "unknown template 'v'"]),
    ({"refs": {"k": ["{{f(c='text')}}", 0, 1]}, "templates": {"f": "{{c}}"}},
     ["refs['k']", "unsupported jinja"]),
    ({"refs": {"k": ["{{f}}", 0, 1]}, "templates": {"f": "{{c}}"}},
     ["refs['k']", "unsupported template syntax"]),
    ({"refs": {"k": ["{{u", 0, 1]}, "templates": {"u": "x"}},
     ["refs['k']", "unsupported template syntax"]),
])
def test_one_bad_ref_is_that_ref_alone(obj: Any, needles: list[str]) -> None:
    """A malformed ref does not refuse the file: it becomes a ``BadRef`` that says
    what is wrong (read, it gives EIO on its object), the others parse as usual."""
    obj["refs"]["ok"] = ["/abs/f.h5", 1, 2]
    table = parse(obj)
    bad = table.refs["k"]
    assert isinstance(bad, BadRef), bad
    assert bad.problem.startswith("/data/refs/x.json: ")
    for needle in needles:
        assert needle in bad.problem, (needle, bad.problem)
    assert table.refs["ok"] == RangeRef("/abs/f.h5", 1, 2)


@pytest.mark.parametrize(("raw", "needle"), [
    (b"", "it is empty"),
    (b"  \n\0 ", "it is empty"),
    (b"\x89HDF\r\n\x1a\n\0\0\0", "it is an HDF5 file"),
    (b"[1, 2]", "it starts with b'[1, 2]'"),
    (b"PAR1....", "it starts with"),
])
def test_not_a_reference_file(raw: bytes, needle: str) -> None:
    message = refuse(raw, needle)
    assert message.startswith("not a LINDI or kerchunk reference file: /data/refs/x.json")


@pytest.mark.parametrize("raw", [b"{", b'{"refs": {"a": 1,}}', b"{} {}", b'{"a": "\xff"}',
                                 b"{" * 100_000])
def test_invalid_json(raw: bytes) -> None:
    refuse(raw, "/data/refs/x.json: reference file: invalid JSON")


# ---------------------------------------------------------------- real lindi files

@pytest.fixture(scope="module")
def h5file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lindi") / "data.h5"
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "lindi test"
        f.create_dataset("contig", data=np.arange(5000, dtype="<f8"))
        f.create_dataset("chunked", data=np.arange(20000, dtype="<i4").reshape(200, 100),
                         chunks=(20, 100))
        f.create_dataset("gz", data=np.arange(4000, dtype="<i8"), chunks=(1000,),
                         compression="gzip", shuffle=True)
        f.create_dataset("many", data=np.arange(3000, dtype="<i2"), chunks=(10,))
        f.create_dataset("scalar", data=7.5)
        f.create_dataset("text", data="hello")
        f.create_dataset("small", data=np.arange(10, dtype="u1"))
        g = f.create_group("grp")
        g.attrs["n"] = 3
        g.create_dataset("inner", data=np.ones((30, 30), dtype="<f4"), chunks=(10, 30))
    return path


def check_against_lindi(table: RefTable, path: Path) -> None:
    """Every key gives the bytes lindi's own reader gives (before its zero padding)."""
    expected = lindi_read(path, raw=True)
    assert set(table.refs) == set(expected)
    for key, value in expected.items():
        assert ref_bytes(table.refs[key]) == value, key


@pytest.mark.tools
def test_lindi_json(h5file: Path, tmp_path: Path) -> None:
    out = write_lindi("json", h5file, tmp_path / "data.lindi.json", threshold=100)
    table = load(out)
    assert table.kind == "lindi"
    assert table.location == str(out)
    assert table.size == out.stat().st_size
    assert table.mtime == pytest.approx(out.stat().st_mtime)
    assert table.refs["chunked/0.0"] == RangeRef(str(h5file), table.refs["chunked/0.0"].offset,
                                                 20 * 100 * 4)
    assert json.loads(table.refs[".zattrs"]) == {"title": "lindi test"}
    # "many" has 300 chunks, more than the threshold: an external array link
    link = json.loads(table.refs["many/.zattrs"])["_EXTERNAL_ARRAY_LINK"]
    assert table.resolve(link["url"]) == str(h5file)
    assert not any(k.startswith("many/") and k[-1].isdigit() for k in table.refs)
    check_against_lindi(table, out)


@pytest.mark.tools
def test_lindi_json_relative_url(h5file: Path, tmp_path: Path) -> None:
    """Chunk URLs written relative (``./data.h5``) resolve next to the reference file.
    (lindi 0.4.6 itself cannot read ``./`` URLs outside a tar or directory.)"""
    h5 = tmp_path / "data.h5"
    h5.write_bytes(h5file.read_bytes())
    out = write_lindi("json", h5, tmp_path / "rel.lindi.json", url="./data.h5")
    assert '"u1": "./data.h5"' in out.read_text()
    table = load(out)
    absolute = load(write_lindi("json", h5, tmp_path / "abs.lindi.json"))
    assert table.refs == absolute.refs
    assert table.refs["contig/0"].url == str(h5)


def tar_offsets(path: Path) -> dict[str, tuple[int, int]]:
    with tarfile.open(path) as tar:
        return {m.name: (m.offset_data, m.size) for m in tar.getmembers()}


@pytest.mark.tools
def test_lindi_tar(h5file: Path, tmp_path: Path) -> None:
    """Enough blobs that lindi moves lindi.json and .tar_index.json to the tar's end."""
    out = write_lindi("tar", h5file, tmp_path / "data.lindi.tar", blobs=300)
    members = tar_offsets(out)
    assert any(name.startswith(".trash/lindi.json") for name in members)
    assert any(name.startswith(".trash/.tar_index.json") for name in members)
    table = load(out)
    assert table.kind == "lindi.tar"
    assert table.location == str(out)
    assert table.size == out.stat().st_size
    blob = table.refs["blob_3/1"]
    assert blob == RangeRef(str(out), members["blobs/blob_3/1"][0], 8000)
    assert table.refs["contig/0"].url == str(h5file)
    assert isinstance(table.refs["tiny/0"], bytes)
    check_against_lindi(table, out)
    # lindi's reader as it is (with its padding) agrees on the blobs too
    keys = [f"blob_{i}/{j}" for i in (0, 299) for j in (0, 1)]
    for key, value in lindi_read(out, keys).items():
        assert ref_bytes(table.refs[key]) == value


@pytest.mark.tools
def test_lindi_tar_without_blobs(h5file: Path, tmp_path: Path) -> None:
    out = write_lindi("tar", h5file, tmp_path / "plain.lindi.tar")
    table = load(out)
    assert table.kind == "lindi.tar"
    check_against_lindi(table, out)


@pytest.mark.tools
def test_lindi_dir(h5file: Path, tmp_path: Path) -> None:
    out = write_lindi("dir", h5file, tmp_path / "data.lindi.d", blobs=2)
    table = load(out, is_dir=True)
    assert table.kind == "lindi.d"
    assert table.location == str(out)
    assert table.size == (out / "lindi.json").stat().st_size
    assert table.refs["blob_1/0"] == RangeRef(str(out / "blobs" / "blob_1" / "0"), 0, 8000)
    check_against_lindi(table, out)


# ---------------------------------------------------------------- load_reference refusals

def test_load_refuses_other_files(h5file: Path, tmp_path: Path) -> None:
    with pytest.raises(RefFormatError, match=f"not a LINDI or kerchunk reference file: "
                                             f"{h5file} \\(it is an HDF5 file\\)"):
        load(h5file)
    other = tmp_path / "other.tar"
    member = tmp_path / "m.txt"
    member.write_text("x")
    with tarfile.open(other, "w", format=tarfile.USTAR_FORMAT) as tar:
        tar.add(member, arcname="m.txt")
    with pytest.raises(RefFormatError, match=r"not a \.lindi\.tar: its first member is 'm\.txt'"):
        load(other)
    empty_dir = tmp_path / "empty.lindi.d"
    empty_dir.mkdir()
    with pytest.raises(RefFormatError, match=r"has no lindi\.json"):
        load(empty_dir, is_dir=True)
    with pytest.raises(NotFound):
        load(tmp_path / "missing.lindi.json")
    ustar = tmp_path / "ustar.json"  # JSON, with "ustar" where a tar header has it
    ustar.write_bytes(b'{"refs": {"' + b"k" * 242 + b'": "ustar"}}')
    assert ustar.read_bytes()[257:262] == b"ustar"
    assert load(ustar).refs == {"k" * 242: b"ustar"}
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"{" + b" " * 5000 + b"}}")
    with pytest.raises(RefFormatError, match=f"{bad}: reference file: invalid JSON"):
        load(bad)


@pytest.mark.tools
def test_load_refuses_broken_tar(h5file: Path, tmp_path: Path) -> None:
    out = write_lindi("tar", h5file, tmp_path / "broken.lindi.tar")
    data = bytearray(out.read_bytes())
    entry = json.loads(data[512:1536].rstrip(b" "))
    start = entry["index"]["d"]
    index = json.loads(data[start:start + entry["index"]["s"]].rstrip(b" "))
    for item in index["files"]:
        if item["n"] == "lindi.json":
            item["s"] = len(data)
    text = json.dumps(index).encode()
    data[start:start + entry["index"]["s"]] = text.ljust(entry["index"]["s"])
    out.write_bytes(bytes(data))
    with pytest.raises(RefFormatError, match=r"files\[\d\] \('lindi.json'\): .* past the end"):
        load(out)


# ---------------------------------------------------------------- over HTTP

@pytest.fixture
def http_files(h5file: Path, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    http_server = pytest.importorskip("tests.http_server")
    pytest.importorskip("mountd.io.http")
    root = tmp_path / "www"
    root.mkdir()
    (root / "data.h5").write_bytes(h5file.read_bytes())
    with http_server.RangeHttpServer(root) as server:
        yield server, root


def load_http(url: str, *, is_dir: bool = False) -> RefTable:
    from mountd.io.http import HttpOptions, open_http  # noqa: PLC0415

    async def run() -> RefTable:
        async with open_http(HttpOptions(timeout=10)) as conn:
            return await load_reference(url, conn.locate, is_dir=is_dir)

    return trio.run(run)


@pytest.mark.server
@pytest.mark.tools
def test_remote_tar_reads_only_the_index_chain(http_files: tuple[Any, Path]) -> None:
    server, root = http_files
    out = write_lindi("tar", root / "data.h5", root / "data.lindi.tar", url="./data.h5",
                      blobs=150)
    server.clear()
    url = server.url_for("data.lindi.tar")
    table = load_http(url)
    assert table.kind == "lindi.tar"
    assert table.remote is True
    assert table.location == url
    assert table.size == out.stat().st_size
    assert table.refs["contig/0"].url == server.url_for("data.h5")
    members = tar_offsets(out)
    assert table.refs["blob_0/0"] == RangeRef(url, members["blobs/blob_0/0"][0], 8000)
    requests = server.requests()
    assert len(requests) == 3  # probe (header + .tar_entry.json), .tar_index.json, lindi.json
    assert all(r[0] == "GET" and r[2] is not None for r in requests), requests
    read = sum(int(b) - int(a) + 1 for a, b in
               (r[2].removeprefix("bytes=").split("-") for r in requests))
    assert read < out.stat().st_size / 4
    local = load(out)
    for key, ref in local.refs.items():
        if isinstance(ref, RangeRef) and ref.url == str(out):
            assert table.refs[key] == RangeRef(url, ref.offset, ref.length)


@pytest.mark.server
@pytest.mark.tools
def test_remote_json_and_dir(http_files: tuple[Any, Path]) -> None:
    server, root = http_files
    write_lindi("json", root / "data.h5", root / "data.lindi.json", url="./data.h5")
    table = load_http(server.url_for("data.lindi.json") + "?token=1")
    assert table.kind == "lindi"
    assert table.refs["contig/0"].url == server.url_for("data.h5")
    write_lindi("dir", root / "data.h5", root / "data.lindi.d", url="./data.h5", blobs=1)
    for url, is_dir in ((server.url_for("data.lindi.d"), False),
                        (server.url_for("data.lindi.d") + "/", False),
                        (server.url_for("data.lindi.d"), True)):
        table = load_http(url, is_dir=is_dir)
        assert table.kind == "lindi.d"
        assert table.location == server.url_for("data.lindi.d")
        assert table.refs["blob_0/1"] == RangeRef(
            server.url_for("data.lindi.d/blobs/blob_0/1"), 0, 8000)
        # "./data.h5" was written for the directory's parent; lindi.json is one level down
        assert table.refs["contig/0"].url == server.url_for("data.lindi.d/data.h5")


# ---------------------------------------------------------------- real kerchunk

@pytest.mark.filterwarnings("ignore:The following exception was caught and quashed")
def test_kerchunk_v1(h5file: Path, tmp_path: Path) -> None:
    """kerchunk 0.2.10 writes version 1 with .zarray as JSON strings (and quashes an
    error on the scalar string dataset, leaving it without a chunk)."""
    hdf = pytest.importorskip("kerchunk.hdf")
    with open(h5file, "rb") as f:
        refs = hdf.SingleHdf5ToZarr(f, str(h5file), inline_threshold=0).translate()
    out = tmp_path / "data.json"
    out.write_text(json.dumps(refs))
    table = load(out)
    assert table.kind == "kerchunk"
    assert isinstance(refs["refs"]["chunked/.zarray"], str)
    zarray = json.loads(table.refs["chunked/.zarray"])
    assert zarray["chunks"] == [20, 100]
    with h5py.File(h5file) as f:
        for name in ("chunked", "gz"):
            ds = f[name]
            for key, ref in table.refs.items():
                if not key.startswith(f"{name}/") or not key[-1].isdigit():
                    continue
                assert isinstance(ref, RangeRef)
                assert ref.url == str(h5file)
                index = tuple(int(i) * c for i, c in
                              zip(key.split("/")[-1].split("."), ds.chunks, strict=True))
                assert ref_bytes(ref) == ds.id.read_direct_chunk(index)[1], key

