"""Benchmarks that write the docs under docs/benchmarks/ (``decodebench bench NAME``)."""
