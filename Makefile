# Stateward: every verb bootstraps what it needs (virtualenv, Python deps, control-plane binaries).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_FLAGS ?=

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@echo "==> Creating the virtualenv in $(VENV) and installing Stateward with its dev tools"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

.PHONY: venv
venv: $(STAMP) ## Create the virtualenv and install the project (once)

.PHONY: binaries
binaries: $(STAMP) ## Build the Kubernetes, etcd and kwok binaries into the cache (once)
	@$(BIN)/stateward local build

.PHONY: run
run: binaries ## Main job: local cluster + operator + a sample PostgresCluster, until Ctrl-C
	@$(BIN)/stateward local run

.PHONY: test
test: binaries ## Every test: unit, integration, e2e
	@$(BIN)/pytest $(PYTEST_FLAGS) tests

.PHONY: test-unit
test-unit: $(STAMP) ## Unit tests only (no binaries, seconds)
	@$(BIN)/pytest -m unit $(PYTEST_FLAGS) tests/unit

.PHONY: lint
lint: $(STAMP) ## ruff, mypy --strict and the import-layer contracts
	@$(BIN)/ruff check src tests
	@$(BIN)/ruff format --check src tests
	@$(BIN)/mypy src
	@$(BIN)/lint-imports

.PHONY: fmt
fmt: $(STAMP) ## Format and autofix
	@$(BIN)/ruff format src tests
	@$(BIN)/ruff check --fix src tests

.PHONY: manifests
manifests: $(STAMP) ## Regenerate the CRDs and RBAC under config/ from the code
	@$(BIN)/python -m stateward.api.manifests

.PHONY: up
up: binaries ## Start the local cluster only
	@$(BIN)/stateward local up

.PHONY: down
down: $(STAMP) ## Stop the local cluster and remove its state
	@$(BIN)/stateward local down
