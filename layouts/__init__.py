"""Storage formats (HSDS, LINDI) that build the HDF5 object model, and conventions."""
