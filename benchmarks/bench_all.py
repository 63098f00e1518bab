"""Every benchmark and benchmarks/results/REPORT.md (`spotlight bench all`, `make bench`); see roll_spotlight/tools/bench/suite.py."""
from roll_spotlight.tools.bench.suite import main

if __name__ == "__main__":
    raise SystemExit(main())
