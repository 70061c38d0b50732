# rlfleet: `make train` sets up .venv (if missing) and trains the default recipe; `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RECIPE ?= metaworld_quickstart_tinyoft
ARGS ?=

.PHONY: system-deps setup test-deps train test test-all test-gpu lint lint-imports bench proto proto-check node-env clean

# What `make setup` installs: every simulator and tracker, plus the test tools (pyproject.toml extras)
EXTRAS ?= all,dev

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# Re-installs only when pyproject.toml changes; torch comes first so the CPU wheel is used.
# pip's progress stays visible: a first install downloads simulators and trackers (minutes).
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing torch==2.13.0 and rlfleet[$(EXTRAS)] into $(VENV) (EXTRAS=... to choose, e.g. EXTRAS=metaworld,dev)"
	$(BIN)/pip install "torch==2.13.0"
	$(BIN)/pip install -e ".[$(EXTRAS)]"
	touch $(STAMP)

# Pixel observations render offscreen with EGL (Mesa llvmpipe on CPU): install it when missing.
system-deps:
	@ldconfig -p | grep -q "libEGL.so.1" || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri libglx-mesa0 libopengl0; \
	  else echo "warning: rendering needs libEGL and Mesa: sudo apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri"; fi; }
	@# SAPIEN (RoboTwin-style env) renders through Vulkan: Mesa 25 lavapipe on CPU (state-only works without)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  bash deploy/install_lavapipe.sh >/dev/null || echo "warning: no lavapipe; RoboTwin envs run state-only (image_size=0)"; \
	else dpkg-query -W mesa-vulkan-drivers >/dev/null 2>&1 || echo "note: RoboTwin images need Vulkan: sudo bash deploy/install_lavapipe.sh"; fi

setup: system-deps $(STAMP)

# The scale-out tests need iproute2 (network namespaces) and Node.js (the EnvService example):
# installed when missing and running as root (CI); otherwise those tests skip and say why.
test-deps:
	@missing=""; command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v node >/dev/null && command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && apt-get install -y -qq $$missing; \
	elif [ -n "$$missing" ]; then echo "note: without$$missing some scale-out tests skip"; fi

train: setup
	$(BIN)/rlfleet train $(RECIPE) $(ARGS)

test: setup test-deps
	$(BIN)/pytest -q

test-all: setup test-deps
	$(BIN)/pytest -q -m "slow or not slow"

test-gpu: setup
	$(BIN)/pytest -q -rs tests/gpu

# Style (ruff), types (mypy: the packages in pyproject's [tool.mypy] files) and the layer contract
# (.importlinter). The same checks as .pre-commit-config.yaml.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The layer contract alone (also part of `make lint`).
lint-imports: setup
	$(BIN)/lint-imports

bench: setup
	$(BIN)/python bench/throughput.py $(ARGS)

proto: setup
	$(BIN)/python -m rlfleet.wire.codegen

proto-check: setup
	$(BIN)/python -m rlfleet.wire.codegen --check

# The Node.js EnvService example (examples/node_env): install its pinned packages when node exists.
node-env:
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
	  cd examples/node_env && npm ci --ignore-scripts --no-audit --no-fund; \
	else echo "node/npm not found: skipping examples/node_env (its test is skipped too)"; fi

clean:
	rm -rf runs .pytest_cache
