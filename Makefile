# Two user-facing targets: `make quickstart` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: quickstart test bench venv clean compare-roll

$(VENV)/.torch:
	@echo "setting up $(VENV) (first run only, about 1.5 min): torch 2.13.0 CPU, then this package"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	touch $@

$(VENV)/.installed-%: $(VENV)/.torch setup.py roll_spotlight/plugins.py  # plugins.py: the entry points
	$(PIP) install -q -e ".[$*]"
	touch $@

# the quickstart needs no extra (the OCR one alone is about 180 MB: opencv, onnxruntime)
$(VENV)/.installed: $(VENV)/.torch setup.py roll_spotlight/plugins.py
	$(PIP) install -q -e .
	touch $@

quickstart: $(VENV)/.installed
	$(VENV)/bin/spotlight quickstart

test: $(VENV)/.installed-dev,ocr
	$(PY) -m pytest -q tests

# Every benchmark + benchmarks/results/REPORT.md (< 60 min on 2 cores); e.g. BENCH_ARGS="--smoke".
BENCH_ARGS ?=
bench: $(VENV)/.installed-dev,ocr
	SPOTLIGHT_THREADS=1 OMP_NUM_THREADS=1 $(VENV)/bin/python -m benchmarks.suite $(BENCH_ARGS)

# The tiny Spotlight ROLL recipe and its vanilla twin under ROLL, then `spotlight compare` (exit 1 when
# Spotlight is worse beyond the tolerance). Needs ROLL installed (docs/roll.md): ROLL_PY is that
# environment's python, whose bin/ (with the `ray` command) goes first on PATH. Not part of `make test`.
# A ROLL launch that starts Ray ends with `ray stop --force`: every Ray cluster of this user (docs/roll.md).
# EMULATE=GPU (h100, h800, h200, a100): the Qwen-Image OCR recipe and its vanilla twin at 512x512 on
# emulated GPUs instead (TIME_SCALE; shipped OCR prompts; the packaged AWS trace drives the spot raylets),
# so the report also gives time and cost to the target (docs/roll.md, "A dry run on emulated GPUs").
ROLL_PY ?= python
COMPARE_DIR ?= output/compare-roll
EMULATE ?=
TIME_SCALE ?= 30
ifdef EMULATE
COMPARE_RECIPE ?= qwen_image_ocr_512
ROLL_ARGS ?= max_steps=6 eval_steps=2 ++task.val_prompts=64 spot.max_workers=8
LAUNCH_FLAGS = --emulate $(EMULATE) --time-scale $(TIME_SCALE)
LAUNCH_OVERRIDES = spot.source=market ++spot.trace=$(CURDIR)/roll_spotlight/spot/data/bamboo-spot-traces/aws/p3-trace.csv
LAUNCH_ENV = OCR_PROMPTS_DIR=$(abspath $(COMPARE_DIR))/prompts
else
COMPARE_RECIPE ?= tiny_shapes_roll
ROLL_ARGS ?= max_steps=20 eval_steps=5
endif
roll_run = $(LAUNCH_ENV) PATH="$$(dirname "$$(command -v $(ROLL_PY))"):$$PATH" OMP_NUM_THREADS=1 $(ROLL_PY) \
  -m roll_spotlight.launch --config_path configs/roll --config_name $(1) $(LAUNCH_FLAGS) \
  output_dir=$(COMPARE_DIR) $(LAUNCH_OVERRIDES) $(ROLL_ARGS)
compare-roll:
	rm -rf $(COMPARE_DIR)
	$(if $(EMULATE),$(ROLL_PY) -m roll_spotlight.cli prompts ocr --out $(COMPARE_DIR)/prompts --train 4000 --test 200)
	$(call roll_run,$(COMPARE_RECIPE))
	$(call roll_run,$(COMPARE_RECIPE)_vanilla)
	$(ROLL_PY) -m roll_spotlight.compare $(COMPARE_DIR)/$(COMPARE_RECIPE) $(COMPARE_DIR)/$(COMPARE_RECIPE)_vanilla \
	  --out $(COMPARE_DIR)/report --fail-if-worse

clean:
	rm -rf $(VENV) build *.egg-info
