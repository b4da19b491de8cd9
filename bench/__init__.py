"""Benchmarks of h5mount against its peers (not tests: run them by hand, see docs/benchmarks.md)."""
