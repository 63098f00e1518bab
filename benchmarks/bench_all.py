"""Every benchmark and benchmarks/results/REPORT.md (`spotlight bench all`, `make bench`); see roll_spotlight/benchmarks/suite.py."""
from roll_spotlight.benchmarks.suite import main

if __name__ == "__main__":
    raise SystemExit(main())
