"""Benchmarking: workloads, the metrics store, in-process and HTTP drivers, capacity search, profiling
and plots."""
