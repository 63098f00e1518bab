"""Warm regroup vs cold restart of an SP group (`spotlight bench regroup`); see roll_spotlight/elastic/bench.py."""
from roll_spotlight.elastic.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
