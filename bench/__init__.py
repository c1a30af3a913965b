"""Benchmarks of the operator at scale on the embedded local cluster (``make bench``)."""
