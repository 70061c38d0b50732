# rlfleet: `make train` sets up .venv (if missing) and trains the default recipe; `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RECIPE ?= metaworld_quickstart_tinyoft
ARGS ?=

.PHONY: system-deps setup train test test-all bench proto proto-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Re-installs only when pyproject.toml changes; torch comes first so the CPU wheel is used.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

# Pixel observations render offscreen with EGL (Mesa llvmpipe on CPU): install it when missing.
system-deps:
	@ldconfig -p | grep -q "libEGL.so.1" || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri libglx-mesa0 libopengl0; \
	  else echo "warning: rendering needs libEGL and Mesa: sudo apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri"; fi; }

setup: system-deps $(STAMP)

train: setup
	$(BIN)/rlfleet train $(RECIPE) $(ARGS)

test: setup
	$(BIN)/pytest -q

test-all: setup
	$(BIN)/pytest -q -m "slow or not slow"

bench: setup
	$(BIN)/python bench/throughput.py $(ARGS)

proto: setup
	$(BIN)/python -m rlfleet.wire.codegen

proto-check: setup
	$(BIN)/python -m rlfleet.wire.codegen --check

clean:
	rm -rf runs .pytest_cache
