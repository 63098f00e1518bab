"""The benchmark harness, outside the package: every benchmark, the measurement harnesses (replay,
soak, cluster-soak) and the benchmark report's writer (`report`). Run from the repository root as
``python -m benchmarks.<name>``; `python -m benchmarks.suite` (``make bench``) runs them all and
writes benchmarks/results/REPORT.md. A wheel of roll_spotlight does not ship it."""
