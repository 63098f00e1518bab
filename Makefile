# Two user-facing targets: `make quickstart` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: quickstart test bench venv clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	touch $@

$(VENV)/.installed-%: $(VENV)/.torch setup.py
	$(PIP) install -q -e ".[$*]"
	touch $@

quickstart: $(VENV)/.installed-ocr
	$(VENV)/bin/spotlight quickstart

test: $(VENV)/.installed-dev,ocr
	$(PY) -m pytest -q tests

# Every benchmark + benchmarks/results/REPORT.md (< 60 min on 2 cores); e.g. BENCH_ARGS="--smoke".
BENCH_ARGS ?=
bench: $(VENV)/.installed-dev,ocr
	SPOTLIGHT_THREADS=1 OMP_NUM_THREADS=1 $(VENV)/bin/spotlight bench all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
