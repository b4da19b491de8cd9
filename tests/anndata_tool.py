"""Writes ``.h5ad`` files with anndata itself and exports what anndata reads back.

A standalone script: stdlib, numpy, pandas, scipy, awkward and anndata only
(no h5mount import), run with the interpreter of ``.venv-conv`` (anndata
pins pandas below 3, which the main virtualenv has)::

    python tests/anndata_tool.py write DIR          # writes DIR/NAME.h5ad for NAMES
    python tests/anndata_tool.py read H5AD OUTDIR   # what anndata reads, for the tests

``write`` makes:

* ``sparse.h5ad``: CSR ``X`` (float32); ``obs`` with categorical (a missing
  value, labels with a comma and a quote), nullable integer and boolean,
  string, bool, float and int columns; ``var`` with a named index and an
  ordered categorical; dense and CSC ``layers``; ``obsm`` dense and two
  awkward arrays (lists of numbers; records of strings and optional lists);
  ``obsp`` CSR, ``varp`` CSC; ``uns`` scalars, a string, a nested dict, a
  categorical, a string array and nullable arrays; ``raw``.
* ``strings.h5ad``: dense ``X``, written with pandas' future string inference
  on (what pandas 3 gives anndata): the index and string columns are
  ``nullable-string-array``, with a missing value.
* ``big.h5ad``: gzip-compressed (so chunked) and big enough for several
  blocks of every view: 3000 x 200 CSR ``X`` of about 90,000 entries, a
  categorical of 2500 categories, a CSC layer and a 3000-row awkward array.

``read`` writes ``OUTDIR/expected.json`` (the frames as ``{"index_name",
"index", "columns": {name: values}}`` with ``null`` for missing values and
categoricals as their labels; ``uns``; awkward arrays as ``to_list``; the
shape) and each matrix of ``X``, ``layers``, ``obsp`` and ``varp`` as
``KEY.npz`` (sparse, ``scipy.sparse.save_npz``) or ``KEY.npy`` (dense), with
``/`` in the key written ``__``.

Concurrency: none; one process writes one directory.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import anndata as ad
import awkward as ak
import numpy as np
import pandas as pd
import scipy.sparse as sp

warnings.simplefilter("ignore")  # anndata's "awkward support is experimental"
ad.settings.allow_write_nullable_strings = True


def write_sparse(path: Path) -> None:
    n, m = 12, 5
    rng = np.random.default_rng(1)
    labels = ["a", "b", None, "a", "c,d", 'q"x', "b", "a", None, "c,d", "b", "a"]
    obs = pd.DataFrame({
        "cat": pd.Categorical(labels),
        "nint": pd.array([1, None, 3, -4, 5, None, 7, 8, 9, 10, None, 12], dtype="Int64"),
        "nbool": pd.array([True, None, False, True, False, True] * 2, dtype="boolean"),
        "s": [f"s{i}" if i % 3 else f"s {i}, with comma" for i in range(n)],
        "b": [bool(i % 2) for i in range(n)],
        "f": np.array([0.1, -2.5e-8, 1e20, np.nan, 3.0, 1 / 3] * 2),
        "i": np.arange(n, dtype=np.int32) * 1000,
    }, index=[f"cell{i}" for i in range(n)])
    var = pd.DataFrame({"g": pd.Categorical(["x", "y", "x", "y", "x"], ordered=True),
                        "w": np.linspace(0, 1, m, dtype=np.float32)},
                       index=pd.Index([f"gene{i}" for i in range(m)], name="gene"))
    x = sp.random(n, m, density=0.4, format="csr", dtype=np.float32, random_state=0)
    a = ad.AnnData(X=x, obs=obs, var=var)
    a.raw = a
    a.layers["dense"] = np.arange(n * m, dtype=np.int64).reshape(n, m)
    a.layers["csc"] = sp.csc_matrix(x.astype(np.float64) * 3)
    a.obsm["pca"] = rng.random((n, 2))
    a.obsm["awk"] = ak.Array([[1, 2], [], [3], [4, 5, 6], [7], [8], [], [9, 10], [11], [],
                              [12], [13, 14]])
    a.obsm["records"] = ak.Array([{"name": f"r{i}", "vals": [0.5 * i, None][:i % 3]}
                                  for i in range(n)])
    a.obsp["conn"] = sp.random(n, n, density=0.3, format="csr", random_state=2)
    a.varp["corr"] = sp.random(m, m, density=0.5, format="csc", random_state=3)
    a.uns["scal"] = 3.5
    a.uns["count"] = 42
    a.uns["str"] = "hello, world"
    a.uns["d"] = {"i": 4, "arr": np.arange(3), "inner": {"s": "deep"}}
    a.uns["cats"] = pd.Categorical(["u", "v", None, "u"])
    a.uns["strs"] = np.array(["a", "b b", "c,c"], dtype=object)
    a.uns["nint"] = pd.array([1, None, 3], dtype="Int64")
    a.uns["nbool"] = pd.array([None, True, False], dtype="boolean")
    a.uns["nstr"] = pd.array(["u", None, "w"], dtype="string")
    a.write_h5ad(path)


def write_strings(path: Path) -> None:
    pd.options.future.infer_string = True
    try:
        n = 5
        obs = pd.DataFrame({
            "name": ["p", None, "q", "r,s", "t"],
            "code": ["x1", "x2", "x3", "x4", "x5"],
            "v": np.arange(n, dtype=np.float64),
        }, index=pd.Index([f"c{i}" for i in range(n)], name="cell"))
        a = ad.AnnData(X=np.arange(n * 3, dtype=np.float64).reshape(n, 3), obs=obs)
        a.write_h5ad(path)
    finally:
        pd.options.future.infer_string = False


def write_big(path: Path) -> None:
    n, m = 3000, 200
    rng = np.random.default_rng(7)
    codes = rng.integers(-1, 2500, n)
    obs = pd.DataFrame({
        "cluster": pd.Categorical.from_codes(codes, [f"cluster {k}" for k in range(2500)]),
        "score": rng.normal(size=n),
        "depth": pd.array(np.where(rng.random(n) < 0.1, None, rng.integers(0, 10**6, n)),
                          dtype="Int64"),
    }, index=[f"bc{i:05d}" for i in range(n)])
    x = sp.random(n, m, density=0.15, format="csr", dtype=np.float32, random_state=5)
    a = ad.AnnData(X=x, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(m)]))
    a.layers["counts"] = sp.csc_matrix((x * 100).astype(np.int32))
    a.obsm["lists"] = ak.Array([list(range(i % 7)) for i in range(n)])
    a.write_h5ad(path, compression="gzip")


WRITERS = {"sparse": write_sparse, "strings": write_strings, "big": write_big}


def plain(value: Any) -> Any:
    """A value as JSON holds it: None for missing, Python scalars, lists."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray | pd.api.extensions.ExtensionArray | pd.Categorical):
        return [plain(v) for v in np.asarray(value, dtype=object).tolist()]
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


def frame(df: pd.DataFrame) -> dict[str, Any]:
    return {"index_name": df.index.name, "index": plain(list(df.index)),
            "columns": {name: plain(list(df[name].astype(object))) for name in df.columns}}


def save_matrix(out: Path, key: str, matrix: Any) -> None:
    name = key.replace("/", "__")
    if sp.issparse(matrix):
        sp.save_npz(out / f"{name}.npz", sp.csr_matrix(matrix))
    else:
        np.save(out / f"{name}.npy", np.asarray(matrix))


def read(path: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    a = ad.read_h5ad(path)
    save_matrix(out, "X", a.X)
    for group in ("layers", "obsp", "varp"):
        for key, matrix in getattr(a, group).items():
            save_matrix(out, f"{group}/{key}", matrix)
    awkward = {key: ak.to_list(v) for key, v in a.obsm.items() if isinstance(v, ak.Array)}
    expected = {"shape": list(a.shape), "obs": frame(a.obs), "var": frame(a.var),
                "uns": plain(dict(a.uns)), "awkward": awkward,
                "raw_var": frame(a.raw.var) if a.raw is not None else None}
    (out / "expected.json").write_text(json.dumps(expected))


def main(argv: list[str]) -> int:
    if argv[:1] == ["write"] and len(argv) == 2:
        directory = Path(argv[1])
        directory.mkdir(parents=True, exist_ok=True)
        for name, writer in WRITERS.items():
            writer(directory / f"{name}.h5ad")
        return 0
    if argv[:1] == ["read"] and len(argv) == 3:
        read(Path(argv[1]), Path(argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
