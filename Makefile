# Two commands on a fresh machine: `make demo` and `make test`.
#
# Everything installs from the lock files, with uv (itself installed from PyPI into .venv-tools):
#   requirements.lock         the core: what `pip install .` pulls, the gateway alone (the image)
#   requirements-tools.lock   what `make demo` runs on (the core + the tools extra)
#   requirements-dev.lock     what `make test` runs on (the core + the dev extra, which holds tools)
#   requirements-floors.lock  the lowest versions pyproject.toml's floors allow: `make test` runs the
#                             tests that start no process once more on them (`make floors`)
# `make lock` regenerates all four from pyproject.toml (docs/dependencies.md). An environment is
# synced again only when its lock or pyproject.toml changes (stamp files), so re-runs are fast.
PYTHON     ?= python3
UV_VERSION := 0.13.9
VENV       := .venv
BIN        := $(VENV)/bin
TOOLS      := .venv-tools
UV         := $(TOOLS)/bin/uv
FLOORS     := .venv-floors
ROUTER     := .venv-router
# The bench-only environment of SGLang's Rust router (`make bench` measures it beside the gateway).
SGLANG_ROUTER := sglang-router==0.3.2
# One resolution for every platform and Python version the project supports, with hashes.
COMPILE := $(UV) pip compile pyproject.toml --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command "make lock"
# After a sync: pyproject.toml's requirements are all met by what the lock installed (or the lock is stale).
CHECK = $(UV) pip check --quiet --python $(1)/bin/python || \
	{ echo "$(1): the installed lock does not satisfy pyproject.toml; run 'make lock'" >&2; exit 1; }

.PHONY: demo test unit integration deploy-tests floors lint fmt lock install install-dev clean bench-loadgen bench-trace soak bench bench-instructions bench-routers
.PHONY: bench-fleets
.PHONY: bench-profile container-test scaleout

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --disable-pip-version-check -q 'uv==$(UV_VERSION)'

# --seed: pip inside the venv, so `.venv/bin/pip install` keeps working for a quick experiment.
$(BIN)/python: | $(UV)
	$(UV) venv --quiet --seed --python $(PYTHON) $(VENV)

# `uv pip sync` makes the venv hold exactly the lock; `--no-deps -e .`: the project itself, editable.
# A venv that has had the dev extra keeps it (`make demo` after `make test` must not take pytest
# away): it is synced from the dev lock, a superset of the tools one.
$(VENV)/.installed: requirements-tools.lock requirements-dev.lock pyproject.toml | $(BIN)/python $(UV)
	if [ -f $(VENV)/.installed-dev ]; then lock=requirements-dev.lock; else lock=requirements-tools.lock; fi; \
	$(UV) pip sync --quiet --python $(BIN)/python $$lock
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	@$(call CHECK,$(VENV))
	touch $@

$(VENV)/.installed-dev: requirements-dev.lock pyproject.toml | $(BIN)/python $(UV)
	$(UV) pip sync --quiet --python $(BIN)/python requirements-dev.lock
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	@$(call CHECK,$(VENV))
	touch $(VENV)/.installed $@

$(FLOORS)/.installed: requirements-floors.lock pyproject.toml | $(UV)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(FLOORS)
	$(UV) pip sync --quiet --python $(FLOORS)/bin/python requirements-floors.lock
	$(UV) pip install --quiet --python $(FLOORS)/bin/python --no-deps -e .
	@$(call CHECK,$(FLOORS))
	touch $@

$(ROUTER)/.installed: Makefile | $(UV)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(ROUTER)
	$(UV) pip install --quiet --python $(ROUTER)/bin/python '$(SGLANG_ROUTER)'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

lock: | $(UV)
	$(COMPILE) -o requirements.lock
	$(COMPILE) --extra tools -o requirements-tools.lock
	$(COMPILE) --extra dev -o requirements-dev.lock
	$(COMPILE) --extra dev --resolution lowest-direct -o requirements-floors.lock

demo: install
	$(BIN)/specroute demo

# The stages of `make test`, in order, each failing fast; .ci/run runs the same ones and times each.
# lint first: a type or format error fails in seconds, before the suite's minutes.
TEST_STAGES := lint unit integration deploy-tests floors
PYTEST      := $(BIN)/python -m pytest -p no:cacheprovider

test: install-dev
	@for stage in $(TEST_STAGES); do $(MAKE) --no-print-directory $$stage || exit 1; done

# Pure in-process tests: no process, no socket (tests/unit_only.py fails one that tries); well under a minute.
unit: install-dev
	$(PYTEST) -q tests/unit

# Real processes and HTTP on loopback: twins, gateways, the CLI, the openai SDK (about 10 minutes).
integration: install-dev
	$(PYTEST) -q tests/integration

# The deployment files: the image, compose, Kubernetes, Helm, Grafana, scale-out (docker where it can run).
deploy-tests: install-dev
	$(PYTEST) -q tests/deploy

# Every test that starts no child process (tests/unit_only.py) on the lowest versions the floors allow.
floors: $(FLOORS)/.installed
	$(FLOORS)/bin/python -m pytest -q -rfE -p tests.unit_only -p no:cacheprovider

# ruff (lint + format check), mypy, and the import contract (the product imports no tooling; gateway ->
# policies -> backends); settings in pyproject.toml.
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# Formats the tree and applies ruff's safe fixes: what `make lint` then accepts.
fmt: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

soak: install-dev
	$(BIN)/python -m pytest -m soak -s

bench: install $(ROUTER)/.installed
	$(BIN)/python -m bench.gateway_bench --rust-router $(ROUTER)/bin/python

bench-instructions: install
	$(BIN)/python -m bench.instructions
	$(BIN)/python -m bench.decisions

bench-loadgen: install
	$(BIN)/python -m loadgen.bench_self

# Trace replay fidelity: the committed Mooncake slice through a gateway over four K2.6 twins, at real
# time (docs/evaluation.md); `python -m loadgen.bench_trace --help` for other traces and windows.
bench-trace: install
	$(BIN)/python -m loadgen.bench_trace

# Routing on the Mooncake trace and the agentic shape on the virtual clock: specroute on plan's fleet
# against the best homogeneous fleet behind SGLang's router and every single strategy (docs/evaluation.md).
# MOONCAKE_TRACE=path/to/conversation_trace.jsonl: the whole trace (the committed slice without it).
bench-fleets: install
	$(BIN)/python -m bench.fleet_routing $(if $(MOONCAKE_TRACE),--trace $(MOONCAKE_TRACE))

# specroute against SGLang's router and LiteLLM on fresh twins (docs/routing.md); the peers install
# into their own .venv-bench/ virtualenvs on first use, never into the project's.
bench-routers: install
	$(BIN)/python -m bench.routers

# `specroute profile` on twins at time scale 1 (docs/your-model.md#measured): the quick sweep of each
# truth (bundled K2.6 and Qwen3.6 profiles, a perturbed copy) and its held-out errors; plan on the
# fitted profiles against plan on the true ones; a full sweep, checked over HTTP too. About an hour.
bench-profile: install
	$(BIN)/python -m bench.profile_fit --no-http
	$(BIN)/python -m bench.profile_plan
	$(BIN)/python -m bench.profile_fit --profiles k26-dflash --perturb '' --full-only --output out/bench-profile-full

# The image and compose stack for real (a private dockerd; docs/deployment.md), and scale-out measured.
container-test: install-dev
	$(BIN)/python -m pytest -m container -s tests/deploy/test_deploy_docker.py

scaleout: install
	$(BIN)/python deploy/local/scaleout.py

clean:
	rm -rf $(VENV) $(TOOLS) $(FLOORS) $(ROUTER) .venv-bench build *.egg-info
