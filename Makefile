# Two commands on a fresh machine: `make demo` and `make test`.
# The venv is rebuilt only when pyproject.toml changes (stamp files), so re-runs are fast.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test lint install install-dev clean bench-loadgen soak bench bench-instructions bench-routers

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[dev]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/specroute demo

test: install-dev
	$(BIN)/python -m pytest

# ruff (lint + format check) and mypy; settings in pyproject.toml.
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

soak: install-dev
	$(BIN)/python -m pytest -m soak -s

bench: install
	$(BIN)/python -m bench.gateway_bench

bench-instructions: install
	$(BIN)/python -m bench.instructions

bench-loadgen: install
	$(BIN)/python -m loadgen.bench_self

# specroute beside SGLang's router and LiteLLM on the same twins; the peers get venvs of their own
# (.venv-bench/), created on first use. Table on stdout, JSON in bench/routers/results/.
bench-routers: install
	$(BIN)/python -m bench.routers

clean:
	rm -rf $(VENV) build *.egg-info
