"""Small HDF5 files, written with h5py, that cover what HSDS can store.

This module owns the test data that the HSDS fixture hsloads. Each ``write_*``
function writes one file into a directory and returns its path; ``write_all``
writes every file and returns ``{file name: path}``. The set is split into
several files so that one object ``hsload`` cannot copy does not lose the rest.

Everything here was checked by hsloading it into HSDS 1.0.2 (h5pyd 1.0.0) and
reading it back with h5pyd. What hsload refused or mangled was dropped; see
the ``DROPPED`` notes next to each writer.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np

log = logging.getLogger(__name__)

#: Name of the file the external link in ``links.h5`` points to.
EXTERNAL_TARGET = "extlink_target.h5"

#: A 300-byte link name (ASCII), longer than NAME_MAX of most file systems.
LONG_NAME = "long_" + "n" * 295

#: A 300-byte UTF-8 name of 2-byte characters: a 240-byte cut lands on a boundary,
#: a 255-byte one would not.
LONG_UTF8_NAME = "é" * 150

#: Link names that a file system view must escape or disambiguate (each a
#: scalar int32 dataset in ``links.h5:/names``, value = index here). ``..`` is a
#: legal HDF5 link name. ``.zattrs``/``.zgroup``/``.zarray`` collide with files a
#: Zarr view generates.
ODD_NAMES = (
    "percent%41name",
    "100%",
    "with space",
    "unicodé_名前",
    ".hidden",
    "..",
    ".zattrs",
    ".zgroup",
    ".zarray",
    LONG_NAME,
    LONG_UTF8_NAME,
)


def _ints_and_floats(f: h5py.File) -> None:
    grp = f.create_group("numeric")
    for kind, sizes in (("i", (1, 2, 4, 8)), ("u", (1, 2, 4, 8)), ("f", (2, 4, 8))):
        for size in sizes:
            for order, label in (("<", "le"), (">", "be")):
                dt = np.dtype(f"{order}{kind}{size}")
                if kind == "f":
                    data = np.linspace(-2.5, 2.5, 12, dtype=dt).reshape(3, 4)
                elif kind == "i":
                    info = np.iinfo(dt)
                    data = np.array(
                        [info.min, -1, 0, 1, 2, 3, 4, 5, 6, 7, 100, info.max], dtype=dt
                    ).reshape(3, 4)
                else:
                    info = np.iinfo(dt)
                    data = np.array(
                        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, info.max], dtype=dt
                    ).reshape(3, 4)
                grp.create_dataset(f"{kind}{size * 8}{label}", data=data)


def _strings(f: h5py.File) -> None:
    grp = f.create_group("strings")
    grp.create_dataset("fixed_ascii", data=np.array([b"abc", b"", b"0123456789", b"x"], "S10"))
    utf8_fixed = h5py.string_dtype("utf-8", 10)
    grp.create_dataset(
        "fixed_utf8",
        data=np.array(["héllo".encode(), b"", "日本".encode()], dtype=utf8_fixed),
        dtype=utf8_fixed,
    )
    vlen_ascii = h5py.string_dtype("ascii")
    grp.create_dataset(
        "vlen_ascii",
        data=np.array([b"short", b"", b"a much longer string value", b"z"], dtype=object),
        dtype=vlen_ascii,
    )
    vlen_utf8 = h5py.string_dtype("utf-8")
    grp.create_dataset(
        "vlen_utf8",
        data=np.array(["αβγ", "", "plain", "emoji 🙂"], dtype=object),
        dtype=vlen_utf8,
    )
    grp.create_dataset(
        "vlen_utf8_2d",
        data=np.array([["a", "", "ccc"], ["dddd", "ü", ""]], dtype=object),
        dtype=vlen_utf8,
    )
    grp.create_dataset(
        "vlen_ascii_2d",
        data=np.array([[b"", b"bb"], [b"ccc", b""]], dtype=object),
        dtype=vlen_ascii,
    )


def _compounds(f: h5py.File) -> None:
    grp = f.create_group("compound")
    simple = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S5")])
    grp.create_dataset(
        "simple",
        data=np.array([(1, 1.5, b"one"), (2, -2.5, b"two"), (3, 0.0, b"")], dtype=simple),
    )
    mixed_order = np.dtype([("le", "<i2"), ("be", ">i4"), ("f", ">f4")])
    grp.create_dataset(
        "mixed_order", data=np.array([(1, 2, 3.0), (-1, -2, -3.0)], dtype=mixed_order)
    )
    point = np.dtype([("x", "<f4"), ("y", "<f4")])
    nested = np.dtype([("id", "<i2"), ("pos", point), ("tag", "S3")])
    grp.create_dataset(
        "nested",
        data=np.array([(1, (0.5, 1.5), b"aa"), (2, (2.5, 3.5), b"bb")], dtype=nested),
    )
    with_vlen = np.dtype([("n", "<i4"), ("s", h5py.string_dtype("utf-8"))])
    grp.create_dataset(
        "vlen_field",
        data=np.array([(1, "first"), (2, ""), (3, "drittes ß")], dtype=with_vlen),
    )
    with_array = np.dtype([("id", "<u2"), ("v", "<f4", (3,))])
    grp.create_dataset(
        "array_field",
        data=np.array([(1, (1, 2, 3)), (2, (4, 5, 6))], dtype=with_array),
    )


def _misc_types(f: h5py.File) -> None:
    grp = f.create_group("misc")
    grp.create_dataset("bool", data=np.array([True, False, True, True]))
    colors = h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 42}, basetype="i1")
    grp.create_dataset("enum", data=np.array([0, 1, 42, 1], dtype="i1"), dtype=colors)
    # DROPPED: a dataset whose element type is an array (``("<f4", (3,))``): h5pyd
    # 1.0.0's hsload crashes on its fill value ("truth value of an array ... is
    # ambiguous"). Array types survive as compound fields and attributes.
    arr_t = np.dtype(("<f4", (3,)))
    grp.attrs.create("array_attr", data=np.arange(6, dtype="<f4").reshape(2, 3), dtype=arr_t)
    opaque = np.frombuffer(bytes(range(32)), dtype="V8")
    grp.create_dataset("opaque", data=opaque)

    f["mytype"] = np.dtype([("t", "<f8"), ("v", "<i4")])
    grp.create_dataset(
        "uses_committed",
        data=np.array([(0.5, 1), (1.5, 2)], dtype=f["mytype"].dtype),
        dtype=f["mytype"],
    )

    target = grp["bool"]
    refs = grp.create_dataset("refs", shape=(3,), dtype=h5py.ref_dtype)
    refs[0] = target.ref
    refs[1] = f["compound"].ref
    refs[2] = f.ref
    grp.attrs.create("ref_attr", data=[target.ref, f["numeric"].ref], dtype=h5py.ref_dtype)

    grp.create_dataset("scalar_int", data=np.int32(42))
    grp.create_dataset("scalar_float", data=np.float64(3.25))
    grp.create_dataset("scalar_vlen_str", data="hello scalar", dtype=h5py.string_dtype())
    grp.create_dataset("scalar_fixed_str", data=np.bytes_(b"fixed"))
    # DROPPED: an H5S_NULL dataset (h5py.Empty("f4")): hsload turns it into an
    # H5S_SCALAR dataset with no chunk. Null attributes keep H5S_NULL.
    grp.attrs["null_attr"] = h5py.Empty("i4")


def write_types(directory: Path) -> Path:
    """Every datatype class HSDS can hold: numbers, strings, compounds, enums, refs...

    DROPPED (see the comments in ``_misc_types``): a dataset of array element
    type and an H5S_NULL dataset.
    """
    path = directory / "types.h5"
    with h5py.File(path, "w") as f:
        _ints_and_floats(f)
        _strings(f)
        _compounds(f)
        _misc_types(f)
    return path


def write_layout(directory: Path) -> Path:
    """Shapes, chunking, fill values and partly written datasets."""
    path = directory / "layout.h5"
    with h5py.File(path, "w") as f:
        grow = f.create_dataset(
            "resizable", shape=(10, 6), maxshape=(None, 6), chunks=(4, 6), dtype="<i4"
        )
        grow[...] = np.arange(60, dtype="<i4").reshape(10, 6)
        grow.resize((13, 6))
        grow[10:] = -7

        unlimited_both = f.create_dataset(
            "unlimited_2d", shape=(5, 5), maxshape=(None, None), chunks=(2, 2), dtype="<f8"
        )
        unlimited_both[...] = np.arange(25, dtype="<f8").reshape(5, 5)

        # 2-D on purpose: hsload widens 1-D chunk shapes (towards ~1 MB) so a
        # small 1-D dataset always ends up as one chunk.
        fill_int = f.create_dataset(
            "fill_int", shape=(4, 10), chunks=(2, 5), dtype="<i2", fillvalue=-1
        )
        fill_int[0:2, 0:5] = np.arange(10).reshape(2, 5)
        fill_nan = f.create_dataset(
            "fill_nan", shape=(4, 8), chunks=(2, 4), dtype="<f4", fillvalue=np.nan
        )
        fill_nan[0:2, 0:4] = 1.0  # HSDS stores all 4 chunks: a NaN fill never compares equal
        cdt = np.dtype([("a", "<i4"), ("b", "<f4")])
        fill_cmp = f.create_dataset(
            "fill_compound",
            shape=(4, 3),
            chunks=(2, 3),
            dtype=cdt,
            fillvalue=np.array((9, 0.5), dtype=cdt),
        )
        fill_cmp[0] = np.array([(1, 1.0), (2, 2.0), (3, 3.0)], dtype=cdt)

        sparse = f.create_dataset("sparse", shape=(100, 100), chunks=(10, 10), dtype="<i4")
        sparse[0:10, 0:10] = 1
        sparse[50:60, 20:30] = np.arange(100, dtype="<i4").reshape(10, 10)
        never = f.create_dataset("never_written", shape=(30, 30), chunks=(10, 10), dtype="<f8")
        never.attrs["note"] = "no chunk of this dataset is ever written"

        f.create_dataset(
            "edge_2d",
            data=np.arange(25 * 17, dtype="<f4").reshape(25, 17),
            chunks=(10, 5),
        )
        f.create_dataset(
            "edge_3d",
            data=np.arange(7 * 9 * 11, dtype="<i2").reshape(7, 9, 11),
            chunks=(3, 4, 5),
        )
        f.create_dataset("contiguous", data=np.arange(20, dtype="<u2"))
        f.create_dataset("contiguous_2d", data=np.arange(12, dtype=">f8").reshape(3, 4))
        f.create_dataset("one_element", data=np.array([7], dtype="<i8"))
        # hsload makes this one extendible: maxdims H5S_UNLIMITED, chunks [131072].
        f.create_dataset("zero_size", shape=(0,), dtype="<f4")
        f.create_dataset(
            "zero_size_unlimited", shape=(0, 3), maxshape=(None, 3), chunks=(4, 3), dtype="<i4"
        )
    return path


def filter_data() -> np.ndarray:
    """The (compressible) array most filtered datasets hold: 40x30 float32, 16x16 chunks."""
    base = np.arange(40 * 30, dtype="<f4").reshape(40, 30)
    return (base % 17) * 0.5


def _extra_filtered(f: h5py.File) -> None:
    """An int64 shuffle+gzip dataset and a gzip vlen-string dataset."""
    f.create_dataset(
        "gzip_int64",
        data=np.arange(500, dtype="<i8").reshape(20, 25),
        chunks=(8, 8),
        compression="gzip",
        shuffle=True,
    )
    f.create_dataset(
        "gzip_vlen_str",
        data=np.array([f"row {i}" for i in range(50)], dtype=object),
        dtype=h5py.string_dtype(),
        chunks=(16,),
        compression="gzip",
    )


def write_filters(directory: Path) -> Path:
    """Built-in HDF5 filters that a plain ``hsload`` copies.

    HSDS stores gzip as a Blosc frame with cname zlib. ``shuffle_only`` is kept
    on purpose: HSDS 1.0.2 records the shuffle filter but writes the chunk bytes
    unshuffled (its compressor step is skipped when there is no compressor), and
    HSDS itself then misreads the chunk once it is no longer cached.

    DROPPED: lzf (HSDS answers 400 "Unsupported filter id: 32000").
    Kept but changed by hsload: fletcher32 is silently removed (stored raw, no
    filter listed).
    """
    path = directory / "filters.h5"
    data = filter_data()
    with h5py.File(path, "w") as f:
        f.create_dataset("gzip", data=data, chunks=(16, 16), compression="gzip", compression_opts=4)
        f.create_dataset(
            "gzip_shuffle", data=data, chunks=(16, 16), compression="gzip", shuffle=True
        )
        f.create_dataset("shuffle_only", data=data, chunks=(16, 16), shuffle=True)
        f.create_dataset("fletcher32", data=data, chunks=(16, 16), fletcher32=True)
        _extra_filtered(f)
    return path


def write_plugins(directory: Path) -> Path:
    """hdf5plugin filters; load with ``hsload --ignore-filters`` (see ``LOADS``).

    Plain hsload (h5pyd 1.0.0 with h5py 3.16) fails on every plugin filter with
    "filter unknown is unknown": h5py reports ``compression == "unknown"`` and
    hsload passes that on. ``--ignore-filters`` skips that and maps filter ids
    itself: 32001 (Blosc, any cname) -> HSDS "blosclz", so the cname is lost;
    32004 (LZ4) -> HSDS "lz4", stored as a Blosc lz4 frame; 32008 (Bitshuffle)
    -> plain byte "shuffle", stored unshuffled like ``filters.h5/shuffle_only``.

    DROPPED: hdf5plugin.Zstd (32015; h5json refuses "H5Z_FILTER_ZSTD not
    supported").
    """
    path = directory / "plugins.h5"
    data = filter_data()
    plugin_filters: dict[str, Mapping[str, object]] = {
        "blosc_blosclz": hdf5plugin.Blosc(cname="blosclz"),
        "blosc_lz4": hdf5plugin.Blosc(cname="lz4"),
        "blosc_lz4hc": hdf5plugin.Blosc(cname="lz4hc"),
        "blosc_zlib": hdf5plugin.Blosc(cname="zlib"),
        "blosc_zstd": hdf5plugin.Blosc(cname="zstd"),
        "blosc_bitshuffle": hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.BITSHUFFLE),
        "lz4": hdf5plugin.LZ4(),
        "bitshuffle": hdf5plugin.Bitshuffle(),
        "bitshuffle_lz4": hdf5plugin.Bitshuffle(cname="lz4"),
    }
    with h5py.File(path, "w") as f:
        for name, kwargs in plugin_filters.items():
            f.create_dataset(name, data=data, chunks=(16, 16), **kwargs)
    return path


#: Compressors ``zcompress.h5`` is loaded with (``hsload -z 5 --compression NAME``).
#: DROPPED: zstd (h5json: "H5Z_FILTER_ZSTD not supported"), snappy (same).
ZCOMPRESSORS = ("blosclz", "lz4", "lz4hc", "gzip")


def write_zcompress(directory: Path) -> Path:
    """Unfiltered datasets that hsload compresses itself with ``-z 5 --compression NAME``.

    This is the one way to get HSDS's own Blosc compressors (with and without
    byte shuffle) into a bucket with hsload.
    """
    path = directory / "zcompress.h5"
    data = filter_data()
    with h5py.File(path, "w") as f:
        f.create_dataset("plain", data=data, chunks=(16, 16))
        f.create_dataset("shuffled", data=data, chunks=(16, 16), shuffle=True)
        f.create_dataset(
            "int16_3d",
            data=np.arange(6 * 7 * 8, dtype="<i2").reshape(6, 7, 8),
            chunks=(4, 4, 4),
        )
        f.create_dataset("big_endian", data=data.astype(">f8"), chunks=(16, 16), shuffle=True)
    return path


def write_extlink_target(directory: Path) -> Path:
    """The file ``links.h5`` points its external link at."""
    path = directory / EXTERNAL_TARGET
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.arange(6, dtype="<i4"))
        f.create_group("grp").create_dataset("inner", data=np.float32(1.5))
    return path


def write_links(directory: Path) -> Path:
    """Groups and every kind of link, including cycles and names that need escaping."""
    path = directory / "links.h5"
    with h5py.File(path, "w") as f:
        g3 = f.create_group("g1/g2/g3")
        d = f["g1/g2"].create_dataset("d", data=np.arange(10, dtype="<i4"))
        g3.create_dataset("deep", data=np.float64(2.0))
        f.create_group("empty_group")

        f["g1/soft_abs"] = h5py.SoftLink("/g1/g2/d")
        f["g1/soft_rel"] = h5py.SoftLink("g2/d")
        f["g1/soft_group"] = h5py.SoftLink("/g1/g2")
        f["dangling"] = h5py.SoftLink("/does/not/exist")
        f["ext_data"] = h5py.ExternalLink(EXTERNAL_TARGET, "/data")
        f["ext_group"] = h5py.ExternalLink(EXTERNAL_TARGET, "/grp")
        f["ext_missing"] = h5py.ExternalLink("no_such_file.h5", "/x")
        # Hostile links: shown as symlinks that stay inside the mount.
        f["escape_abs"] = h5py.SoftLink("/../../../../../../../../etc/passwd")
        f["g1/escape_rel"] = h5py.SoftLink("../../../../../../../../etc/passwd")
        f["escape_ext"] = h5py.ExternalLink("/etc/passwd", "/x")
        f["escape_ext_rel"] = h5py.ExternalLink("../../../../../../etc/passwd", "../x")

        f["g1/hard_alias"] = d  # the same dataset at two paths
        # DROPPED: a hard link to the root group (f["g1/up"] = f["/"]): hsload
        # silently leaves it out. A hard link to any other ancestor survives.
        f["g1/g2/back"] = f["g1"]  # cycle to an ancestor

        names = f.create_group("names")
        for i, name in enumerate(ODD_NAMES):
            names.create_dataset(name, data=np.int32(i))
        # Real links whose names a view would also generate for another link.
        names.create_dataset("x", data=np.arange(3, dtype="<i4"))
        names.create_dataset("x.json", data=np.arange(4, dtype="<i4"))
        names.create_dataset("x.npy", data=np.arange(5, dtype="<i4"))
        names.create_group("y")
        names.create_group("y.json")
        names.create_group("with%2Fslash_escape")
    return path


def write_attrs(directory: Path) -> Path:
    """Attributes of many types on the root group, a group, a dataset and a named type."""
    path = directory / "attrs.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("dset", data=np.arange(4, dtype="<f4"))
        g = f.create_group("grp")
        f["named_type"] = np.dtype("<i8")
        for obj in (f, g, d, f["named_type"]):
            _add_attrs(obj, f)
    return path


def _add_attrs(obj: h5py.HLObject, f: h5py.File) -> None:
    a = obj.attrs
    a["str_vlen"] = "a variable-length string"
    a["str_utf8"] = "ünïcødé ✓"
    # hsload stores this as a 7-byte fixed string (the value's length), not S10.
    a.create("str_fixed", data=np.bytes_(b"fixed10"), dtype="S10")
    a["str_array"] = np.array(["one", "", "three"], dtype=object)
    a["int_scalar"] = np.int64(-5)
    a["int_array"] = np.array([1, 2, 3], dtype="<i4")
    a["int_2d"] = np.arange(6, dtype=">u2").reshape(2, 3)
    a["float_special"] = np.array([np.nan, np.inf, -np.inf, 0.5], dtype="<f8")
    a["float32"] = np.float32(1.25)
    a["bool"] = np.bool_(True)
    a["opaque"] = np.void(b"\x00\x01\x02\xff")
    # A scalar reference attribute comes out of hsload as a variable-length
    # string "d-...", so the reference attribute is a 1-element array.
    a.create("ref", data=[f["dset"].ref], dtype=h5py.ref_dtype)
    cdt = np.dtype([("x", "<i4"), ("name", "S4")])
    a["compound"] = np.array([(1, b"ab"), (2, b"cd")], dtype=cdt)
    a["null"] = h5py.Empty("f8")
    a["empty_array"] = np.zeros((0,), dtype="<i4")
    a["units"] = "m/s"


#: Dimensions of ``netcdf.h5``: name -> length.
NETCDF_DIMS = {"time": 10, "x": 6}


def write_netcdf(directory: Path) -> Path:
    """A netCDF4-style file: dimension scales ``time`` and ``x``, ``temp(time, x)``,
    ``flux(time)``, a vlen string ``station(x)`` and a dimensionless scalar ``crs``
    (a CF grid mapping, as most gridded netCDF files have).

    Written with the ``netCDF4`` library when it is installed (the real thing:
    ``_Netcdf4Dimid``, ``_NCProperties``, ``_FillValue``), else with h5py's
    dimension scale API, which gives the same ``DIMENSION_LIST`` and
    ``REFERENCE_LIST`` attributes. hsload keeps both: ``DIMENSION_LIST`` as a
    vlen of object references, ``REFERENCE_LIST`` as a compound of a reference
    and a uint32.
    """
    path = directory / "netcdf.h5"
    time = np.arange(NETCDF_DIMS["time"], dtype="<f8") * 0.5
    x = np.arange(NETCDF_DIMS["x"], dtype="<i4") * 10
    temp = (np.arange(60, dtype="<f4").reshape(10, 6) - 20.0) / 4
    flux = np.linspace(0.0, 1.0, NETCDF_DIMS["time"], dtype="<f8")
    stations = np.array(["north", "", "süd", "east 1", "w", "centre"], dtype=object)
    if importlib.util.find_spec("netCDF4") is not None:
        import netCDF4  # noqa: PLC0415

        with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
            nc.title = "h5mount netCDF4 test file"
            for name, size in NETCDF_DIMS.items():
                nc.createDimension(name, size)
            v = nc.createVariable("time", "f8", ("time",))
            v.units = "days since 2000-01-01"
            v[:] = time
            v = nc.createVariable("x", "i4", ("x",))
            v.units = "m"
            v[:] = x
            v = nc.createVariable("temp", "f4", ("time", "x"), chunksizes=(4, 3),
                                  fill_value=np.float32(-999.0))
            v.units = "K"
            v.long_name = "temperature"
            v.grid_mapping = "crs"
            v[:] = temp
            v = nc.createVariable("flux", "f8", ("time",))
            v.units = "W m-2"
            v[:] = flux
            v = nc.createVariable("station", str, ("x",))
            v[:] = stations
            v = nc.createVariable("crs", "i4")
            v.grid_mapping_name = "latitude_longitude"
            v.assignValue(0)
        return path
    with h5py.File(path, "w") as f:
        f.attrs["title"] = np.bytes_(b"h5mount netCDF4 test file")
        scales = {}
        for name, data, units in (("time", time, "days since 2000-01-01"), ("x", x, "m")):
            ds = f.create_dataset(name, data=data)
            ds.attrs["units"] = np.bytes_(units.encode())
            ds.make_scale(name)
            scales[name] = ds
        t = f.create_dataset("temp", data=temp, chunks=(4, 3), fillvalue=np.float32(-999.0))
        t.attrs["units"] = np.bytes_(b"K")
        t.attrs["long_name"] = np.bytes_(b"temperature")
        t.attrs["grid_mapping"] = np.bytes_(b"crs")
        t.dims[0].attach_scale(scales["time"])
        t.dims[1].attach_scale(scales["x"])
        fl = f.create_dataset("flux", data=flux)
        fl.attrs["units"] = np.bytes_(b"W m-2")
        fl.dims[0].attach_scale(scales["time"])
        st = f.create_dataset("station", data=stations, dtype=h5py.string_dtype())
        st.dims[0].attach_scale(scales["x"])
        crs = f.create_dataset("crs", data=np.int32(0))
        crs.attrs["grid_mapping_name"] = np.bytes_(b"latitude_longitude")
    return path


#: Chunk grid of ``refs.h5:/chunked/many``: over LINDI's 1000-chunk limit, so
#: lindi writes it as an ``_EXTERNAL_ARRAY_LINK`` (2-D: hsload keeps 2-D chunk shapes).
MANY_CHUNKS_SHAPE = (330, 400)
MANY_CHUNKS_CHUNKS = (10, 12)


def write_refs(directory: Path) -> Path:
    """What a LINDI reference file can describe, for comparing LINDI and HSDS mounts.

    lindi 0.4.6 refuses a whole file for one object it cannot convert (array or
    nested compound fields, compound attributes, dimension scales, bitshuffle,
    dangling soft links), so those stay in the other files. No reference
    attribute: lindi refuses an array of them and hsload mangles a scalar one
    (see ``_add_attrs``); ``tests/test_lindi_catalog.py`` checks LINDI's
    ``_REFERENCE`` attributes against h5py. Datasets under
    1000 elements are inlined by lindi; larger ones are byte ranges. It is
    hsloaded with ``--ignore-filters`` (Blosc); no Zstd, which hsload refuses
    even then (see ``write_plugins``).
    """
    path = directory / "refs.h5"
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "reference file test data"
        f.attrs["version"] = np.int32(3)
        f.attrs["scale"] = np.float64(0.25)
        f.attrs["nan"] = np.float32(np.nan)
        f.attrs["vector"] = np.arange(4, dtype="<i8")
        nums = f.create_group("numbers")
        for name in ("<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4",
                     "<f8", ">i4", ">f8"):
            label = name.replace("<", "le_").replace(">", "be_")
            data = (np.arange(1200) % 97).astype(name)
            nums.create_dataset(label, data=data.reshape(40, 30), chunks=(16, 16))
            nums.create_dataset(f"small_{label}", data=data[:12])
        f.create_dataset("flags", data=np.arange(30) % 3 == 0)
        f.create_dataset("fixed_str", data=np.array([b"alpha", b"be", b"gamma!!"], dtype="S7"))
        f.create_dataset("vlen_str", data=np.array(["one", "twee", "drie\u00e9"], dtype=object),
                         dtype=h5py.string_dtype())
        scalars = f.create_group("scalars")
        scalars.create_dataset("int", data=np.int64(-42))
        scalars.create_dataset("float", data=np.float32(2.5))
        scalars.create_dataset("text", data="a scalar string", dtype=h5py.string_dtype())
        scalars.create_dataset("bytes", data=np.bytes_(b"fixed"))
        cdt = np.dtype([("id", "<i4"), ("value", "<f8"), ("tag", "S4")])
        rows = np.array([(i, i * 0.5, f"t{i}".encode()) for i in range(20)], dtype=cdt)
        f.create_dataset("compound", data=rows)
        chunked = f.create_group("chunked")
        data = filter_data()
        chunked.create_dataset("gzip_shuffle_fletcher", data=data, chunks=(16, 16),
                               compression="gzip", shuffle=True, fletcher32=True)
        chunked.create_dataset("blosc", data=data, chunks=(16, 16),
                               **hdf5plugin.Blosc(cname="lz4", clevel=5))
        sparse = chunked.create_dataset("sparse", shape=(64, 64), chunks=(16, 16), dtype="<i4",
                                        fillvalue=-5, compression="gzip")
        sparse[0:16, 16:32] = 3
        many = np.arange(math.prod(MANY_CHUNKS_SHAPE), dtype="<i4").reshape(MANY_CHUNKS_SHAPE)
        chunked.create_dataset("many", data=many, chunks=MANY_CHUNKS_CHUNKS, compression="gzip",
                               shuffle=True)
        f.create_dataset("contiguous", data=np.arange(600 * 50, dtype="<f8").reshape(600, 50))
        f["link_to_numbers"] = h5py.SoftLink("/numbers/le_i4")
    return path


#: File writers, by file name.
WRITERS: dict[str, Callable[[Path], Path]] = {
    EXTERNAL_TARGET: write_extlink_target,
    "types.h5": write_types,
    "layout.h5": write_layout,
    "filters.h5": write_filters,
    "plugins.h5": write_plugins,
    "zcompress.h5": write_zcompress,
    "links.h5": write_links,
    "attrs.h5": write_attrs,
    "netcdf.h5": write_netcdf,
    "refs.h5": write_refs,
}


@dataclass(frozen=True)
class Load:
    """One hsload: ``source`` (a ``WRITERS`` name) to ``domain``, with extra hsload args."""

    domain: str
    source: str
    args: tuple[str, ...] = ()


def _plan() -> tuple[Load, ...]:
    special = ("plugins.h5", "zcompress.h5", "refs.h5")
    loads = [Load(f"home/admin/{name}", name) for name in WRITERS if name not in special]
    # hsload refuses filter plugins (Blosc here) unless it stores the data unfiltered.
    loads += [Load(f"home/admin/{name}", name, ("--ignore-filters",))
              for name in ("plugins.h5", "refs.h5")]
    loads += [
        Load(f"home/admin/zcompress_{name}.h5", "zcompress.h5", ("-z", "5", "--compression", name))
        for name in ZCOMPRESSORS
    ]
    return tuple(loads)


#: Every domain the HSDS fixture creates, in load order (keys have no leading "/").
#: ``zcompress.h5`` is loaded once per compressor and never plainly.
LOADS: tuple[Load, ...] = _plan()


def write_all(directory: Path) -> dict[str, Path]:
    """Write every test file into ``directory``; return ``{file name: path}``."""
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, writer in WRITERS.items():
        out[name] = writer(directory)
        log.debug("wrote %s", out[name])
    return out
