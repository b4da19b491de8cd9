"""h5mount daemon: the format-free tree, storage I/O and the FUSE layer."""

__version__ = "0.1.0"
