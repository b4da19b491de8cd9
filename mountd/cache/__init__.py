"""The daemon's caches and readahead: decoded chunks (``chunkcache``), a
dataset's stored chunk indices (``chunklist``), model objects for
``metadata_ttl`` (``metacache``), values derived from them (``memo``), and
reading ahead of a walker (``dirahead``) or of chunk reads in grid order
(``chunkahead``, ``chunkbatch``); and the mount's memory limit, which lowers
their budgets while the daemon's resident memory is over it (``memlimit``).

Each module says what it bounds and its concurrency rules.
"""

