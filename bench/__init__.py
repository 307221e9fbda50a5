"""Benchmarks: each figure is printed beside a baseline measured in the same run."""
