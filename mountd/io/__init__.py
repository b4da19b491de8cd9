"""Storage access: bytes by key and range. Knows nothing about HDF5."""
