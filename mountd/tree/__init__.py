"""The format-free tree: HDF5 model objects shown as the entries of docs/CONTRACT.md.

Owns the mapping from the object model (``layouts.model``) to nodes
(``mountd.tree.nodes``): folder and domain directories, group and dataset
directories, sidecars, chunk files, symlinks for soft, external and cyclic
hard links, and the entries of views (``.npy`` and the conventions
registered in ``layouts.views.VIEWS``, on the view API of ``layouts.views._api``).

Everything is lazy. A node holds only where it is (``ObjPath``); it reads
the model through ``Tree.obj`` (a TTL-cached catalog) when asked for
content. What is derived from an object (rendered metadata files, a group's
name index, xattrs, a dataset's chunk names, a view file's size) is
memoised in ``Tree.memo`` for as long as the catalog hands out the same
object instances. A walker gets the next directories loaded in the
background, a reader of chunk files in grid order the next chunks decoded
ahead.

One module per concern, each saying what it owns and its concurrency rules:

* ``build``: making a tree (``make_tree``): the views and the root node's
  maker handed to ``Tree``, made before it;
* ``core``: ``Tree``, the nodes' shared context: model access, the
  chunk-cache facade, times, and the parts below that are not nodes; it
  imports no node module;
* ``nodes``: the node kinds (directories, files, symlinks) and their handles;
* ``names``: how link names become file names;
* ``paths``: ``ObjPath`` and where entries are in the mount;
* ``links``: following HDF5 paths and external links;
* ``refindex``: object references to paths;
* ``preload``: loading directories and objects ahead of a walker;
* ``fanout``: bounded concurrent fan-out;
* ``folders``, ``objdir``, ``groups``, ``datasets``: the directory nodes and
  chunk files;
* ``meta``: sidecars and Zarr metadata files, rendered from the documents of
  ``sidecar`` and ``zarrmeta`` (values made JSON by ``jsonvalue``);
* ``viewctx``, ``viewnodes`` and ``viewsizes``: the view API's context, the
  views' nodes and the sizes of view files;
* ``h5view``: the ``D.h5`` view of each domain.
"""

from mountd.tree.build import make_tree
from mountd.tree.core import Tree
from mountd.tree.paths import ObjPath

__all__ = ["ObjPath", "Tree", "make_tree"]
