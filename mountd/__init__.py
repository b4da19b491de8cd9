"""The h5mount daemon: the format-free tree, its caches, storage I/O and the FUSE layer.

Subpackages: ``tree`` (the entries a mount shows, from the model of
``layouts``), ``cache`` (caches and readahead) and ``io`` (bytes by key from
local disk, S3 and http(s)). The top level holds the command line
(``cli``, ``config``), turning SOURCE into a catalog (``sources``), the
process and its signals (``daemon``), the FUSE operations (``fuse_ops``, the
one place errors become errno, with ``inodes`` and ``acls``), the control
directory and statistics (``control``, ``stats``, ``statscli``) and
``h5mount warm`` (``warm``). What a mount promises is ``docs/CONTRACT.md``.
"""

__version__ = "0.1.0"
