"""Benchmarks of the engine against its peers and of its own features (fucina bench)."""
