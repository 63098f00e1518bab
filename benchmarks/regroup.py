"""Warm regroup vs cold restart of an SP group (`spotlight bench regroup`); see roll_spotlight/tools/bench/regroup.py."""
from roll_spotlight.tools.bench.regroup import main

if __name__ == "__main__":
    raise SystemExit(main())
